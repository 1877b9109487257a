"""The consumer's side of ``verify``: what a file's check turns into (wait, refuse, warn, go on) and how
evidence arriving hands the files it covers over again.

Kept apart from the consumer so its import and release logic reads the same with verification off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from reloadd import Ack, Change, JSONValue, Reject, Result, Retry

from ._evidence import Refusal, covered_by
from ._lists import parse_list
from ._policy import Decision, Policy

__all__ = ["Gate", "Stopped", "refused_stat", "with_check"]


class Stopped(Exception):
    """The check that rode an import stopped it before its records: the result to report instead."""

    def __init__(self, result: Result) -> None:
        super().__init__(str(result))
        self.result = result


def refused_stat(reason: Refusal) -> str:
    """The stat exported as ``reloadd_images_refused_total{consumer,reason}``."""
    return f"images_refused_total{{reason={reason.value}}}"


def with_check(data: dict[str, object], d: Decision) -> dict[str, object]:
    """A file's record data plus what its signature check found (key, evidence, digest)."""
    if d.record is not None:
        data["verified"] = d.record
    return data


class Gate:
    """Verification for one consumer.

    Args:
        policy: Its verify policy.
        stats: Its counters (the refusal counters are kept here).
        log: Its logger.
        roots: Its watched folders (refusals show paths from the folder's name).
        trigger: Its ``ctx.trigger``.
        accepts: Its ``accepts`` (only files it handles are handed over again).
    """

    def __init__(self, policy: Policy, stats: dict[str, float], log: logging.Logger, roots: Sequence[Path],
                 trigger: Callable[[Iterable[Path] | None], None], accepts: Callable[[Path], bool]) -> None:
        self.policy = policy
        self.stats = stats
        self.log = log
        self.roots = roots
        self.trigger = trigger
        self.accepts = accepts
        self.handing: dict[Path, int] = {}
        """Paths of the batches being handled now: evidence hands over only the others."""
        if policy.on:  # one series per reason, from zero (a rate over a series that appears later is lost)
            stats.update({refused_stat(r): 0 for r in Refusal})

    def shown(self, path: Path, root: Path | None) -> str:
        """``images/web.tar``: the path from its watched folder's name, as refusals show it."""
        for r in ([root] if root is not None else []) + list(self.roots):
            if r == path or r in path.parents:
                return str(path.relative_to(r.parent))
        return str(path)

    async def check(self, change: Change, shown: str, fd: int | None, previous: JSONValue,
                    digest: tuple[str, int] | None = None) -> tuple[Decision, Result | None]:
        """Judge a file (``digest``: its SHA-256 and size, when known); the result that stops it here (a wait,
        a refusal), or ``None`` to go on."""
        if self.policy.key_error:
            return Decision(), Retry(f"{shown}: {self.policy.key_error}")
        d = await self.policy.decide(change.path, shown, fd, change.fingerprint, digest=digest)
        if d.wait > 0:
            return d, Retry(f"{shown}: waiting for its signature or a signed checksum file (verify_wait, "
                            f"{d.wait:.0f}s left)", after=d.wait, failure=False)
        if d.verdict is not None and d.verdict.refusal is not None and (d.refused or d.warning):
            self.stats[refused_stat(d.verdict.refusal)] += 1
        if d.refused:  # the engine logs the Reject: the one WARNING line
            return d, Reject(d.refused, data=previous)
        if d.warning:
            self.log.warning("%s", d.warning)
        return d, None

    def evidence(self, path: Path) -> Result:
        """A signature, bundle or checksum file changed: hand the files it covers over again.

        Only those not in a batch being handled now (at start-up the archive and its ``.sig`` come
        together) and only ones that exist; their records are not consulted, as a new signature for
        an imported archive may carry a new key (re-importing it costs nothing: every blob is there).
        """
        again = [p for p in covered_by(path) if p not in self.handing and p.is_file() and self.accepts(p)]
        if again:
            self.log.info("Evidence %s changed: handing over %s again", path, ", ".join(map(str, again)))
            self.trigger(again)
        return Ack(None)

    def pinned_only(self, text: str, shown: str, d: Decision) -> tuple[str, str]:
        """Under ``verify``, a list's lines that name a tag, not a digest: a tag can move after signing.

        Returns the text to pull (``require``: those lines blanked, numbering kept) and the refusal
        line naming them ("" when none, or under ``warn``, which logs them and pulls them).
        """
        if d.verdict is None:
            return text, ""
        bad = [(n, ref) for n, ref in parse_list(text)[0] if "@sha256:" not in ref]
        if not bad:
            return text, ""
        why = "not pinned by digest (name@sha256:…): " + ", ".join(f"line {n} {ref}" for n, ref in bad)
        self.stats[refused_stat(Refusal.UNPINNED)] += len(bad)
        line = self.policy.refused_line(shown, d.verdict, why)
        if self.policy.mode != "require":
            self.log.warning("%s", line)
            return text, ""
        lines = text.splitlines()
        for n, _ in bad:
            lines[n - 1] = ""
        return "\n".join(lines), line
