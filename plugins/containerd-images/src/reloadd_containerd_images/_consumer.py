"""The ``containerd-images`` consumer: tarballs and ``.txt`` lists into containerd's image store."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from reloadd import (
    Ack,
    BaseConsumer,
    Batch,
    Change,
    ChangeKind,
    ConsumerContext,
    ConsumerError,
    DriftMode,
    PathRecord,
    PermanentError,
    Plan,
    PlannedChange,
    Provision,
    Reason,
    Reject,
    Result,
    Retry,
    Source,
    SourceContext,
    TransientError,
)

from ._client import CRI_NAMESPACE, ContainerdClient
from ._events import ImageEvents
from ._evidence import is_checksum_file, is_evidence, sha256_fd
from ._holdings import Holdings
from ._importing import Imports
from ._leases import Leases
from ._lists import pull_list, read_list
from ._policy import Decision, Policy, open_for_check
from ._preview import ImagePlanner
from ._provided import Provided, names_of
from ._restore import Restorer
from ._settings import Settings
from ._state import PIN_LABEL, SOURCE_LABEL, FileImages, state_of
from ._unpack import ChainLocks
from ._verifying import Gate, Stopped, with_check

__all__ = ["ContainerdImagesConsumer"]

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst", ".tar.bz2", ".tbz", ".tbz2", ".tar.lz4")


class _EventsFactory:
    """Builds a consumer's ``containerd-events`` source (named, as the core names sources by it)."""

    name = ImageEvents.name

    def __init__(self, consumer: ContainerdImagesConsumer) -> None:
        self.consumer = consumer

    def __call__(self, ctx: SourceContext) -> ImageEvents:
        return self.consumer.make_events(ctx)


class ContainerdImagesConsumer(BaseConsumer):
    """Imports image tarballs and pre-pulls ``.txt`` lists; keeps images pinned while their file exists.

    Args:
        ctx: The consumer context.
        settings: Validated options.
    """

    content_digest = False  # multi-GB tarballs: stat identity is enough
    arrival_at_once = True  # an archive renamed into the folder is complete and stands alone: no quiet wait
    removal_unit = "images"  # what a held removal (prune safety) would unpin or remove
    name_path_in_errors = True  # an error names the archive or list it is about, wherever it is read

    def __init__(self, ctx: ConsumerContext, settings: Settings) -> None:
        super().__init__(ctx)
        self.settings = settings
        self.concurrency = settings.concurrency
        self._client: ContainerdClient | None = None
        self.locks = ChainLocks()
        self.stats: dict[str, float] = {
            "bytes_imported": 0,
            "bytes_sent": 0,
            "images_imported": 0,
            "files_imported": 0,
            "images_pulled": 0,
            "pins_restored": 0,
            "reimports_triggered": 0,
            "import_failures": 0,
            "import_seconds": 0,
        }
        self.policy = Policy(settings.verify, settings.trusted_keys, settings.keys_base, settings.keyring,
                             settings.verify_wait, self.log)
        self.gate = Gate(self.policy, self.stats, self.log, self.roots, self.ctx.trigger, self.accepts)
        self._sem = asyncio.Semaphore(settings.concurrency)
        self.holdings = Holdings(lambda: self.client, self.ctx.records, settings, self.log)
        self.leases = Leases(lambda: self.client, self.name, self.log)
        self.imports = Imports(lambda: self.client, settings, self.locks, self.leases, self.stats, self.log)
        self.restorer = Restorer(lambda: self.client, self.ctx.records, settings, self.leases, self.stats, self.log)
        self._verify: asyncio.Task[None] | None = None
        self.verified = asyncio.Event()
        """Set once the start-up check of recorded images has run."""
        self._busy: dict[Path, int] = {}  # files being imported or pulled now
        self._events: ImageEvents | None = None
        self.provided = Provided(self.ctx.records, lambda p: self.gate.shown(p, None), self._busy)

    @property
    def client(self) -> ContainerdClient:
        """The containerd client (its channel is made on first use, inside the event loop)."""
        if self._client is None:
            self._client = ContainerdClient(self.settings.address, self.settings.namespace, self.settings.timeout)
        return self._client

    def removal_size(self, record: PathRecord) -> int:
        """The images a file's removal would release (``on_delete``), from its data."""
        st = state_of(record.data)
        return len(st.images) if st is not None else 0

    def accepts(self, path: Path) -> bool:
        """Tarballs (``.tar[.gz|.zst|.bz2|.lz4]``, ``.tgz``, ``.tzst``, ``.tbz``) and ``.txt`` lists.

        With ``verify`` on, also their evidence: ``.sig``, ``.sigstore.json`` and ``sha256sum*`` checksum
        files (never read as image lists, verify on or off).
        """
        if is_evidence(path) or is_checksum_file(path):
            return self.policy.on
        name = path.name.lower()
        return name.endswith(TAR_SUFFIXES) or name.endswith(".txt")

    @property
    def status_note(self) -> str | None:
        """The verify policy and its keys (``None`` when ``verify = "off"``)."""
        if not self.policy.on:
            return None
        note = f"verify={self.policy.mode}, keys {self.policy.keyring.shown}"
        return f"{note}; {self.policy.key_error}" if self.policy.key_error else note

    async def start(self) -> None:
        """Check, in the background, that recorded images are still there and pinned.

        Unless the consumer's ``drift`` is ``off``, the ``containerd-events`` source does that check
        after every (re)connect of its stream instead (see :meth:`sources`).
        """
        if self.ctx.drift is DriftMode.OFF:
            self._verify = asyncio.create_task(self._check_records(), name=f"{self.name}:verify")

    def sources(self) -> Sequence[Callable[[SourceContext], Source]]:
        """The ``containerd-events`` source (guarded images); the core starts it unless ``drift = "off"``."""
        return (_EventsFactory(self),)

    def make_events(self, ctx: SourceContext) -> ImageEvents:
        """Build the ``containerd-events`` source (called by the core, through :meth:`sources`)."""
        self._events = ImageEvents(
            ctx, consumer=self.name, address=self.settings.address,
            namespaces={self.settings.namespace, CRI_NAMESPACE}, records=lambda: list(self.ctx.records.items()),
            pin=self.settings.pin, check=self.images_to_restore, checked=self.verified.set,
            busy=self._busy.__contains__,
        )
        return self._events

    async def images_to_restore(self) -> list[Path]:
        """The recorded files whose images are missing or changed in containerd (missing pins are put back).

        Raises:
            TransientError: containerd cannot be reached.
        """
        return await self.restorer.to_restore()

    async def close(self) -> None:
        """Stop the background check and close the channel."""
        if self._verify is not None:
            self._verify.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._verify
        if self._client is not None:
            self._client.close()
            self._client = None

    async def plan(self, batch: Batch) -> Plan:
        """Images each path would import, update, relabel or pull, and release (see ``_preview``).

        Read-only: archives are hashed, not ingested; containerd is only asked (Images Get, CRI
        ImageStatus, Version). The start-up check of recorded images (re-pin, re-import what went
        missing) is not planned.
        """
        planner = ImagePlanner(
            self.client, self.settings, self.imports.importer(),
            self.ctx.records, self._plan_labels, lambda p: self._outside_roots(p, None), (PIN_LABEL, SOURCE_LABEL),
            self.log, self.policy, self.gate.shown,
        )
        return await planner.plan(batch)

    async def plan_drift(self, paths: Sequence[Path]) -> Plan:
        """Images of these recorded files missing, changed or unpinned in containerd (read-only)."""
        out: dict[Path, list[PlannedChange]] = {}
        for path in paths:
            rec = self.ctx.records.get(path)
            st = state_of(rec.data) if rec is not None else None
            if rec is None or st is None or rec.error or not path.exists():
                continue
            for ref, why, _ns in await self.restorer.drift_of(st):
                out.setdefault(path, []).append(PlannedChange.drift(ref, why, "image"))
        return out

    def _plan_labels(self, path: Path) -> dict[str, str]:
        """The labels the pass sets on a file's records: pin, the user's, the source file."""
        labels = {PIN_LABEL: "pinned"} if self.settings.pin else {}
        labels.update(self.settings.labels)
        labels[SOURCE_LABEL] = str(path)
        return labels

    async def handle(self, batch: Batch) -> dict[Path, Result]:
        """Re-read the trusted keys on a SIGHUP's pass, then hand each change to :meth:`handle_one`."""
        if batch.reason is Reason.SIGNAL:
            self.policy.reload()
        handing = self.gate.handing
        for p in batch.paths:
            handing[p] = handing.get(p, 0) + 1
        try:
            return await self.each(batch, batch.changes, self.handle_one)
        finally:
            for p in batch.paths:
                if (n := handing.pop(p) - 1) > 0:
                    handing[p] = n

    async def handle_one(self, change: Change) -> Result:
        """Import, pull or release one path (up to ``concurrency`` at once, across batches).

        The core fans a batch out to this and reports each path as it is done; events about the
        file's images that arrived meanwhile are judged once it is (see ``_events``).
        """
        self._busy[change.path] = self._busy.get(change.path, 0) + 1
        try:
            result = await self._one(change)
        except PermanentError as exc:
            self.stats["import_failures"] += 1
            await self._note(change, exc)
            raise  # the core maps it (rejected until the file changes) and logs it once
        except ConsumerError as exc:
            await self._note(change, exc)
            raise
        else:
            await self._note(change, result)
            return result
        finally:
            if (n := self._busy.pop(change.path) - 1) > 0:
                self._busy[change.path] = n
            elif self._events is not None:
                self._events.settled(change.path)

    def provisions(self, kind: str) -> list[Provision]:
        """The image names each file provides and how its import went (``reloadd.Providing``): a
        kube-manifests consumer names the file when a pod waits for one of them (see ``_provided``)."""
        return self.provided.entries() if kind == "image" else []

    async def _note(self, change: Change, outcome: Result | ConsumerError) -> None:
        path = change.path
        if change.kind is ChangeKind.DELETED:
            self.provided.forget(path)
        elif not (is_evidence(path) or is_checksum_file(path)):
            names = () if isinstance(outcome, Ack) else await asyncio.to_thread(names_of, path)
            self.provided.outcome(path, outcome, names)

    async def _one(self, change: Change) -> Result:
        async with self._sem:
            if change.kind is ChangeKind.DELETED:
                self.policy.forget(change.path)
                if is_evidence(change.path) or is_checksum_file(change.path):
                    return Ack(None)
                return await self._deleted(change.path)
            return await self._changed(change)

    # -- added / modified ----------------------------------------------------------------------
    async def _changed(self, change: Change) -> Result:
        path = change.path
        outside = self._outside_roots(path, change.root)
        if outside:
            self.log.debug("Failed to import %s: %s", path, outside)  # the engine logs the Reject
            return Reject(f"{path}: {outside}", data=self._previous(path))
        if is_evidence(path) or is_checksum_file(path):
            return self.gate.evidence(path)
        shown = self.gate.shown(path, change.root)
        if path.name.lower().endswith(".txt"):
            return await self._list(path, shown, change)
        fd = open_for_check(path) if self.policy.on else None
        try:
            if fd is not None and self.policy.overlaps(path, fd):
                return await self._import_checked(change, shown, fd)
            decision, stop = await self.gate.check(change, shown, fd, self._previous(path))
            if stop is not None:
                return stop
            old = state_of(self.ctx.records[path].data) if path in self.ctx.records else None
            st = await self.imports.run(path, decision.labels, Path(f"/proc/self/fd/{fd}") if fd is not None else None)
        finally:
            if fd is not None:
                os.close(fd)
        await self.holdings.settle(path, st.refs, old.refs - st.refs if old is not None else set())
        return Ack(with_check(st.to_json(), decision))

    def _previous(self, path: Path) -> object:
        """The data of the last successful handling, kept across a Reject.

        The images an earlier version of the file produced are still there; remembering them
        lets a later delete release them.
        """
        rec = self.ctx.records.get(path)
        return rec.data if rec is not None else None

    def _outside_roots(self, path: Path, root: Path | None) -> str:
        """Why ``path`` must not be read (a symlink leaving the watched folders), or ""."""
        try:
            real = path.resolve(strict=True)
        except OSError as exc:
            raise TransientError(f"cannot resolve: {exc}") from exc
        roots = [root] if root is not None else list(self.roots)
        for r in roots:
            rr = Path(r).resolve()
            if real == rr or rr in real.parents:
                return ""
        return f"symlink to {real}, outside the watched folder {roots[0] if roots else '?'}; refusing to read it"

    async def _import_checked(self, change: Change, shown: str, fd: int) -> Result:
        """Import a large file while it is hashed (see ``_policy.OVERLAP_FROM``); judged before any record.

        A refusal (or a file whose import failed and whose check fails too: the refusal says more)
        leaves nothing: the lease goes at once, with the content and snapshots it held.
        """
        path = change.path
        previous = self._previous(path)
        hashing = asyncio.ensure_future(asyncio.to_thread(sha256_fd, fd))
        decided: list[Decision] = []

        async def judged() -> dict[str, str]:
            d, stop = await self.gate.check(change, shown, fd, previous, digest=await hashing)
            decided.append(d)
            if stop is not None:
                raise Stopped(stop)
            return d.labels

        old = state_of(self.ctx.records[path].data) if path in self.ctx.records else None
        try:
            st = await self.imports.run(path, {}, Path(f"/proc/self/fd/{fd}"), judged)
        except Stopped as stopped:
            return stopped.result
        except ConsumerError:
            if not decided:
                _, stop = await self.gate.check(change, shown, fd, previous, digest=await hashing)
                if stop is not None:
                    return stop
            raise
        finally:
            await asyncio.gather(hashing, return_exceptions=True)  # its thread reads fd: not closed before
        await self.holdings.settle(path, st.refs, old.refs - st.refs if old is not None else set())
        return Ack(with_check(st.to_json(), decided[0]))

    async def _list(self, path: Path, shown: str, change: Change) -> Result:
        decision, stop = await self.gate.check(change, shown, None, self._previous(path))
        if stop is not None:
            return stop
        try:
            text = await read_list(path)
        except ValueError as exc:
            return Reject(f"{path}: {exc}", data=self._previous(path))
        text, unpinned = self.gate.pinned_only(text, shown, decision)
        labels = {**self._plan_labels(path), **decision.labels}
        res = await pull_list(self.client, text, labels, self.settings.pull_timeout, self.log, path)
        self.stats["images_pulled"] += res.pulled
        self.log.info(
            "Processed list %s: %d image(s) present, %d pulled, %d invalid line(s), %d failed",
            path,
            len(res.images) - res.pulled,
            res.pulled,
            len(res.invalid),
            len(res.failed),
        )
        st = FileImages(
            "list",
            tuple(
                (str(i["name"]), str(i["digest"]), tuple(i["refs"]))  # type: ignore[arg-type]
                for i in res.images
            ),
        )
        if unpinned:
            return Reject(unpinned, data=with_check(st.to_json(), decision))
        if res.invalid:
            return Reject(f"{path}: " + "; ".join(res.invalid + res.failed), data=st.to_json())
        if res.failed:
            return Retry(f"{path}: " + "; ".join(res.failed))
        old = state_of(self.ctx.records[path].data) if path in self.ctx.records else None
        dropped = old.refs - st.refs if old is not None else set()
        await self.holdings.settle(path, st.refs, dropped, namespace=CRI_NAMESPACE)
        return Ack(with_check(st.to_json(), decision))

    # -- deleted -------------------------------------------------------------------------------
    async def _deleted(self, path: Path) -> Result:
        rec = self.ctx.records.get(path)
        st = state_of(rec.data) if rec is not None else None
        ns = CRI_NAMESPACE if st is not None and st.kind == "list" else None
        await self.holdings.settle(path, set(), st.refs if st is not None else set(), namespace=ns)
        return Ack(None)

    async def _check_records(self) -> None:
        """Wait for containerd, then re-pin or re-import what recorded files produced."""
        await self.restorer.check_records(self.ctx.trigger, self.verified)
