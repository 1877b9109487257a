"""The ``registry-mirrors`` consumer: level-triggered, all-or-nothing, last good kept."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import hashlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from reloadd import (
    Ack,
    BaseConsumer,
    Batch,
    ConsumerContext,
    DriftMode,
    PathRecord,
    Plan,
    PlannedChange,
    Reject,
    ReloaddError,
    Result,
    Source,
    SourceContext,
    TransientError,
    atomic_write,
    set_aside,
)

from ._config import MAX_FILE_SIZE, Settings
from ._containerd import check_config, shadowing
from ._guard import HostsGuard
from ._inputs import Outcome, evaluate, read_snapshot
from ._model import Diagnostic
from ._notify import NotifyError
from ._render import Rendered
from ._write import HOSTS_FILE, ApplyResult, Step, apply, decide, read_hosts_file

__all__ = ["MAX_FILE_SIZE", "RegistryMirrorsConsumer", "Settings"]

class RegistryMirrorsConsumer(BaseConsumer):
    """Keeps ``hosts_dir/<host>/hosts.toml`` in step with containers-registries.conf(5) files.

    Whatever path a batch names, every input is re-read, validated and rendered; only a
    fully valid set is written. On any error the last good files stay, the offending file
    gets a :class:`reloadd.Reject` naming it and the entry, the other paths an Ack.
    A generated text that does not parse back keeps only its own host's previous file and
    Rejects the input it came from; the other hosts are applied. The hosts.toml files of an
    input that is gone while the core holds its removal (prune safety: a vanished or emptied
    registries.conf.d) stay in place.
    """

    removal_unit = "hosts.toml files"

    def __init__(self, ctx: ConsumerContext, settings: Settings) -> None:
        super().__init__(ctx)
        self.settings = settings
        inputs = settings.inputs
        self.roots = [p for p in (inputs.main, inputs.conf_d, inputs.yaml) if p is not None]
        self.stats: dict[str, float] = {
            "reloads": 0,
            "reload_failures": 0,
            "config_valid": 1,
            "hosts_rendered": 0,
            "hosts_invalid": 0,
            "warnings": 0,
            "files_written": 0,
            "files_removed": 0,
            "notify_failures": 0,
        }
        self._roots_before: list[Path] = []
        self._lock = asyncio.Lock()
        self._last_warnings: frozenset[str] = frozenset()
        # What the notify action last confirmed, kept across restarts: a notify cut short by a
        # crash is run again even though the files on disk already match.
        self._notified_file = ctx.state_dir / "notified.sha256"
        self._notified: str | None = None
        self._held: set[Path] = set()  # acknowledged while another input was broken
        self._kept: frozenset[str] = frozenset()  # hosts of gone inputs whose removal is held
        self._expected: dict[str, tuple[bytes, Path]] = {}  # host -> (bytes written, declaring input): the guard's

    def sources(self) -> Sequence[Callable[[SourceContext], Source]]:
        """The ``hosts-guard`` source: a hosts.toml reloadd wrote that is deleted or rewritten is put back.

        The core starts it unless the consumer's ``drift`` is ``off``.
        """
        return (functools.partial(HostsGuard, consumer=self.name, hosts_dir=self.settings.hosts_dir,
                                  expected=lambda: self._expected),)

    def removal_size(self, record: PathRecord) -> int:
        """The hosts.toml files an input's removal would delete (the hosts it declared)."""
        hosts = record.data.get("hosts") if isinstance(record.data, dict) else None
        return len(hosts) if isinstance(hosts, list) else 0

    def _kept_hosts(self) -> frozenset[str]:
        """Hosts declared by recorded inputs that are gone while their removal is held (blocking)."""
        kept: set[str] = set()
        for path, record in list(self.ctx.records.items()):
            hosts = record.data.get("hosts") if isinstance(record.data, dict) else None
            if hosts and self.ctx.removal_held(path) is not None:
                kept.update(str(h) for h in hosts)
        return frozenset(kept)

    def accepts(self, path: Path) -> bool:
        """The main file, the registries.yaml, and ``*.conf`` directly in registries.conf.d."""
        inputs = self.settings.inputs
        if path in (inputs.main, inputs.yaml):
            return True
        return path.parent == inputs.conf_d and path.name.endswith(".conf")

    async def start(self) -> None:
        """Check containerd's config, then bring hosts_dir in step with the inputs once."""
        if self.settings.containerd_config is not None:
            check = await asyncio.to_thread(check_config, self.settings.containerd_config, self.settings.hosts_dir)
            for warning in check.warnings:
                self.log.warning("%s", warning)
            self._roots_before = check.roots_before
        if self.settings.notify.enabled:
            self._notified = await asyncio.to_thread(_read_text, self._notified_file)
        async with self._lock:
            try:
                outcome, _ = await self._reconcile()
            except TransientError as exc:
                self.log.error("Failed to apply registry mirrors at start-up: %s", exc)
                return
        self._ask_for_unreported(outcome, handed=set())

    async def _reconcile(self, handed: Collection[Path] = ()) -> tuple[Outcome, ApplyResult | None]:
        """Re-read, render and write every input; ``handed``: the paths of the batch (``detect`` mode writes
        back only what they declare)."""
        inputs = self.settings.inputs
        snap = await read_snapshot(inputs)
        outcome = evaluate(inputs, snap)
        self.stats["reloads"] += 1
        if outcome.rendered is None:
            self._failed(outcome)
            return outcome, None
        rendered = outcome.rendered
        result, applied = await self._write(rendered, handed)
        outcome = await self._report(outcome, rendered, result, applied)
        await self._notify(applied, result)
        return outcome, result

    def _failed(self, outcome: Outcome) -> None:
        """An input does not load: nothing is written (the last good files stay); count and log why."""
        self.stats["reload_failures"] += 1
        self.stats["config_valid"] = 0
        for diags in outcome.errors.values():
            for d in diags:
                self.log.error("Failed to load %s: %s; the last good hosts.toml files stay", d.path, d)

    async def _write(self, rendered: Rendered, handed: Collection[Path]) -> tuple[ApplyResult, dict[str, str]]:
        """Write the rendered files (held removals kept, drift reclaimed as ``drift`` says); what was applied.

        Raises:
            TransientError: ``hosts_dir`` cannot be written.
        """
        hosts_dir = self.settings.hosts_dir
        kept = await asyncio.to_thread(self._kept_hosts)
        if kept - rendered.files.keys() and kept != self._kept:
            self.log.warning("Keeping hosts.toml of %s: the inputs that declared them are gone, and their removal is "
                             "held (prune safety)", ", ".join(sorted(kept - rendered.files.keys())))
        self._kept = kept
        # Hosts reloadd wrote last time and still declares: theirs to take back if something rewrote them
        # (drift = "detect": only those of the inputs handed over now, an edit or a SIGHUP).
        reclaim = frozenset(self._expected) & rendered.files.keys()
        if self.ctx.drift is DriftMode.OFF:
            reclaim = frozenset()
        elif self.ctx.drift is DriftMode.DETECT:
            reclaim = frozenset(h for h in reclaim if self._expected[h][1] in handed)
        # What the guard compares with, set before the files are written: reloadd's own writes are not drift.
        self._expected = {name: (text.encode(), rendered.origins[name]) for name, text in rendered.files.items()
                          if name in rendered.origins}
        try:
            result = await asyncio.to_thread(apply, hosts_dir, rendered.files, kept, reclaim)
        except OSError as exc:
            self.stats["reload_failures"] += 1
            raise TransientError(f"cannot write under {hosts_dir}: {exc}") from exc
        applied = {name: text for name, text in rendered.files.items() if name not in result.invalid}
        # Refused (invalid) or left alone (another tool's file): not reloadd's, neither guarded nor reclaimed.
        self._expected = {n: w for n, w in self._expected.items() if n in applied and n not in result.skipped}
        return result, applied

    async def _report(
        self, outcome: Outcome, rendered: Rendered, result: ApplyResult, applied: Mapping[str, str]
    ) -> Outcome:
        """Count and log what a write did (each warning said once, not on every reload); the outcome with
        the hosts that could not be rendered."""
        if result.invalid:
            self.stats["reload_failures"] += 1
            outcome = _with_invalid_output(outcome, result.invalid)
            for name, why in sorted(result.invalid.items()):
                self.log.error(
                    "Failed to render hosts.toml for registry host %s: %s; not written, its previous file stays",
                    name,
                    why,
                )
        self.stats["config_valid"] = 1
        self.stats["hosts_rendered"] = len(applied)
        self.stats["hosts_invalid"] = len(result.invalid)
        self.stats["warnings"] = len(rendered.warnings)
        self.stats["files_written"] += len(result.written)
        self.stats["files_removed"] += len(result.removed)
        messages = [str(w) for w in rendered.warnings] + list(result.skipped.values())
        messages += await asyncio.to_thread(shadowing, self.settings.hosts_dir, self._roots_before, applied)
        if frozenset(messages) != self._last_warnings:  # say each warning once, not on every reload
            for message in messages:
                if message not in self._last_warnings:
                    self.log.warning("%s", message)
            self._last_warnings = frozenset(messages)
        if result.changed:
            self.log.info(
                "Applied registry mirrors in %s: wrote %s, removed %s",
                self.settings.hosts_dir,
                ", ".join(result.written) or "nothing",
                ", ".join(result.removed) or "nothing",
            )
        return outcome

    async def _notify(self, applied: Mapping[str, str], result: ApplyResult) -> None:
        """Run the ``notify`` command when files changed or it has not yet succeeded for what is applied."""
        digest = _files_digest(applied)
        if self.settings.notify.enabled and (result.changed or digest != self._notified):
            try:
                await self.settings.notify(sorted(applied), result.written, result.removed)
            except NotifyError as exc:
                self.stats["notify_failures"] += 1
                self.log.warning("Failed to notify after applying registry mirrors: %s", exc)
            else:
                self._notified = digest
                await asyncio.to_thread(_write_text, self._notified_file, digest)

    def _ask_for_unreported(self, outcome: Outcome, handed: set[Path]) -> None:
        """Have the engine hand over broken inputs it has not seen fail, so they get a Reject."""
        stale = [
            p
            for p in outcome.errors
            if p not in handed and self.accepts(p) and (p not in self.ctx.records or self.ctx.records[p].error is None)
        ]
        if stale:
            self.ctx.trigger(stale)

    async def plan(self, batch: Batch) -> Plan:
        """Render every input in memory and diff it with the hosts.toml files on disk.

        Level-triggered like :meth:`start` and :meth:`handle`: whatever the batch holds,
        the next pass makes ``hosts_dir`` match the inputs, so that is what is compared.
        With a broken input nothing would be written (the last good files stay): no changes.
        """
        inputs = self.settings.inputs
        outcome = evaluate(inputs, await read_snapshot(inputs))
        if outcome.rendered is None:  # the pass would write nothing: the plan fails, naming each broken input
            return {path: [PlannedChange.invalid(path, f"{'; '.join(map(str, diags))}; the next pass would write "
                                                       "nothing")] for path, diags in outcome.errors.items()}
        hosts_dir = self.settings.hosts_dir
        kept = await asyncio.to_thread(self._kept_hosts)  # as the pass: hosts of held drop-ins stay
        steps = await asyncio.to_thread(decide, hosts_dir.resolve(), outcome.rendered.files, kept)
        return {
            hosts_dir / step.name / HOSTS_FILE: [_planned(hosts_dir / step.name / HOSTS_FILE, step)]
            for step in steps
            if step.action in ("write", "remove")
        }

    async def plan_drift(self, paths: Sequence[Path]) -> Plan:
        """hosts.toml files these recorded inputs declared, deleted or rewritten since (read-only)."""
        inputs = self.settings.inputs
        outcome = evaluate(inputs, await read_snapshot(inputs))
        if outcome.rendered is None:
            return {}
        out: dict[Path, list[PlannedChange]] = {}
        for path in paths:
            record = self.ctx.records.get(path)
            data = record.data if record is not None and isinstance(record.data, dict) else {}
            for host in data.get("hosts") or ():
                text = outcome.rendered.files.get(host)
                if host in (data.get("left_alone") or ()):
                    continue  # another tool's file, which the pass leaves alone
                if text is None or outcome.rendered.origins.get(host) != path:
                    continue  # no longer declared by it: the plan lists the removal
                target = self.settings.hosts_dir / host / HOSTS_FILE
                have = await asyncio.to_thread(read_hosts_file, target.parent)
                if have != text.encode():
                    why = "deleted" if have is None else "rewritten by something else"
                    out.setdefault(path, []).append(PlannedChange.drift(str(target), why, "file"))
        return out

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        """Re-read everything; apply all or nothing; Reject the broken files of the batch."""
        async with self._lock:
            outcome, result = await self._reconcile(batch.paths)
        handed = set(batch.paths)
        if result is None:
            self._ask_for_unreported(outcome, handed)
            results: dict[Path, Result] = {}
            for path in batch.paths:
                errors = outcome.errors.get(path)
                if errors:
                    results[path] = Reject("; ".join(str(d) for d in errors))
                else:
                    # Valid itself, but nothing was applied: keep its previous data for now.
                    record = self.ctx.records.get(path)
                    results[path] = Ack(record.data if record is not None else None)
                    self._held.add(path)
            return results
        self._ask_for_unreported(outcome, handed)
        held, self._held = self._held - handed, set()
        # Rejected earlier (an invalid output) but fine now without changing themselves.
        held |= {
            p
            for p, record in self.ctx.records.items()
            if record.error is not None and p not in outcome.errors and p not in handed and self.accepts(p)
        }
        if held:
            self.ctx.trigger(sorted(held))  # refresh their data now that the set applied
        rendered = outcome.rendered
        assert rendered is not None  # result is only set after a successful render
        results = {}
        for path in batch.paths:
            data: dict[str, list[str]] = {
                "hosts": sorted(
                    name for name, origin in rendered.origins.items() if origin == path and name not in result.invalid
                ),
                "warnings": [str(w) for w in rendered.warnings if w.path == path],
            }
            foreign = [name for name in data["hosts"] if name in result.skipped]
            if foreign:
                data["left_alone"] = foreign  # another tool's hosts.toml: neither written nor guarded
            errors = outcome.errors.get(path)
            results[path] = Reject("; ".join(str(d) for d in errors), data) if errors else Ack(data)
        return results


def _with_invalid_output(outcome: Outcome, invalid: Mapping[str, str]) -> Outcome:
    """``outcome`` with an error on the input each refused host came from, naming the host."""
    rendered = outcome.rendered
    assert rendered is not None
    errors = {path: list(diags) for path, diags in outcome.errors.items()}
    for name, why in sorted(invalid.items()):
        origin = rendered.origins[name]
        errors.setdefault(origin, []).append(Diagnostic(origin, f"registry host {name}", f"{why}; not written"))
    return dataclasses.replace(outcome, errors=errors)


def _planned(path: Path, step: Step) -> PlannedChange:
    """A write or removal :func:`decide` chose, as a plan entry with its unified diff."""
    old = (step.current or b"").decode(errors="replace").splitlines(keepends=True)
    new = step.text.splitlines(keepends=True)
    action = "remove" if step.action == "remove" else "update" if step.current is not None else "create"
    diff = difflib.unified_diff(old, new, f"{path} (on disk)" if old else "/dev/null",
                                f"{path} (rendered)" if new else "/dev/null")
    return PlannedChange(action, str(path), "".join(diff), {"host": step.name})


def _files_digest(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for host in sorted(files):
        h.update(host.encode() + b"\0" + files[host].encode() + b"\0")
    return h.hexdigest()


_NOTIFY_AGAIN = "the notify action runs again once"


def _read_text(path: Path) -> str | None:
    """The digest last notified; a file that is not one is set aside (``reloadd.set_aside``): notify again."""
    try:
        text = path.read_bytes().strip().decode("ascii", "replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        set_aside(path, exc.strerror or str(exc), _NOTIFY_AGAIN)
        return None
    if len(text) != 64 or text.strip("0123456789abcdef"):
        set_aside(path, "not a sha256 digest", _NOTIFY_AGAIN)
        return None
    return text


def _write_text(path: Path, text: str) -> None:
    try:
        atomic_write(path, text.encode())
    except ReloaddError as exc:  # only costs a repeated notify after a restart
        logging.getLogger(__name__).warning("Failed to record the notified state: %s", exc)
