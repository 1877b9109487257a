"""Guarded images: containerd's image events as a far-side change source (``containerd-events``).

containerd publishes ``/images/create``, ``/images/update`` and ``/images/delete`` on one server-streaming
``Events/Subscribe``, the same method in 1.6, 1.7 and 2.x (the envelope's bytes are identical; only its proto
package moved in 2.0). Events live in memory only: a stream that ends (containerd restarted) is reopened by the
core's supervisor with backoff, and after every (re)connect every recorded image is checked once, because
events were missed meanwhile.

An image a recorded file produced that is **deleted** (``ctr images rm``, kubelet's image GC, ``crictl rmi``),
or **updated** without reloadd's pin or with another file's source label, is drift: the source emits
``DRIFTED`` for that file, and the engine hands it to the consumer again (``Reason.DRIFT``), which imports or
pulls it and labels it again. reloadd's own writes carry its labels, so they are not drift; an image whose file
is gone is meant to go, so it is not drift either.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from reloadd import Drift, EventKind, PathRecord, SourceContext, SourceEvent, TransientError

from ._client import ContainerdClient
from ._errors import map_grpc_error
from ._proto.containerd.events import image_pb2
from ._proto.containerd.services.events.v1 import events_grpc, events_pb2
from ._state import PIN_LABEL, SOURCE_LABEL, state_of

__all__ = ["ImageEvents", "drifted", "owners_of"]

_MESSAGES: dict[str, Any] = {  # generated classes (untyped)
    "/images/create": image_pb2.ImageCreate,
    "/images/update": image_pb2.ImageUpdate,
    "/images/delete": image_pb2.ImageDelete,
}


def owners_of(records: Iterable[tuple[Path, PathRecord]]) -> dict[str, list[Path]]:
    """Image record name → the recorded files that produced it (from their acknowledged data)."""
    out: dict[str, list[Path]] = {}
    for path, rec in records:
        st = state_of(rec.data)
        if st is None or rec.error:
            continue
        for ref in st.refs:
            out.setdefault(ref, []).append(path)
    return out


def drifted(topic: str, name: str, labels: Mapping[str, str], owners: Mapping[str, list[Path]], *, pin: bool,
            exists: Callable[[Path], bool] = os.path.exists) -> Path | None:
    """The file to hand over again for one image event, or ``None`` (pure but for ``exists``).

    Deleted: the first owner whose file still exists. Created or updated: when the pin is
    missing (``pin`` on) or the source label names no owner — one owner is enough to put it back.
    """
    files = [p for p in owners.get(name, ()) if exists(p)]
    if not files:
        return None  # not ours, or its file is gone: it is meant to go
    if topic == "/images/delete":
        return files[0]
    source = labels.get(SOURCE_LABEL)
    if pin and labels.get(PIN_LABEL) != "pinned":
        return Path(source) if source is not None and Path(source) in files else files[0]
    if source is None or Path(source) not in files:
        return files[0]
    return None


class ImageEvents:
    """The ``containerd-events`` source of one ``containerd-images`` consumer.

    Args:
        ctx: The source context (``emit``, the logger).
        consumer: Its consumer's name (the ``DRIFTED`` events are for it).
        address: containerd's socket.
        namespaces: The containerd namespaces its images live in.
        records: The consumer's records as ``(path, record)`` pairs, read at each event.
        pin: Whether the consumer pins its images (a missing pin is then drift).
        check: Returns the recorded files whose images are missing or changed (the full check
            after a (re)connect; it restores missing pins itself).
        checked: Called after each full check (the consumer's ``verified`` event).
        busy: Whether the consumer is importing or pulling a file right now: events about its images
            wait for :meth:`settled` (its own writes are not drift).
    """

    name = "containerd-events"

    def __init__(self, ctx: SourceContext, *, consumer: str, address: str, namespaces: Collection[str],
                 records: Callable[[], Iterable[tuple[Path, PathRecord]]], pin: bool,
                 check: Callable[[], Awaitable[list[Path]]], checked: Callable[[], None] = lambda: None,
                 busy: Callable[[Path], bool] = lambda path: False) -> None:
        self.ctx = ctx
        self.consumer = consumer
        self.address = address
        self.namespaces = sorted(set(namespaces))
        self.records = records
        self.pin = pin
        self.check = check
        self.checked = checked
        self.busy = busy
        self._client: ContainerdClient | None = None
        self._stash: dict[tuple[str, str], tuple[str, Path]] = {}  # (image, namespace) -> (topic, file) while busy
        self._tasks: set[asyncio.Task[None]] = set()
        self.log = logging.getLogger(f"reloadd.consumer.{consumer}.events")

    def _emit(self, path: Path, what: str, why: str) -> None:
        self.log.debug("Image drift: %s %s (declared by %s)", what, why, path)
        self.ctx.emit(SourceEvent(EventKind.DRIFTED, path, source=self.name, consumer=self.consumer,
                                  drift=Drift("image", what, why)))

    async def run(self) -> None:
        """Subscribe, check every recorded image once, then turn each image event into drift or nothing.

        Raises:
            TransientError: the stream could not be opened, or ended (containerd restarted): the
                supervisor opens it again after a backoff, and the check runs again.
        """
        client = self._client = ContainerdClient(self.address, self.namespaces[0])
        try:
            stub = events_grpc.EventsStub(client.channel)
            # One filter per namespace (entries are OR'ed, the comma inside one is AND'ed); quoted, as
            # containerd's filter scanner treats a bare "/" as a delimiter.
            filters = [f'topic~="/images/",namespace=="{ns}"' for ns in self.namespaces]
            try:
                async with stub.Subscribe.open() as stream:
                    await stream.send_message(events_pb2.SubscribeRequest(filters=filters), end=True)
                    redo = await self.check()  # subscribed first, then the relist: nothing falls in between
                    for path in redo:
                        self._emit(path, f"the images of {path.name}", "missing or changed (seen at (re)connect)")
                    self.checked()
                    async for envelope in stream:
                        await self._on(client, envelope)
            except TransientError:
                raise
            except Exception as exc:
                raise map_grpc_error(exc, "Events.Subscribe") from exc
            raise TransientError("containerd ended the event stream")
        finally:
            self._client = None
            client.close()

    async def _on(self, client: ContainerdClient, envelope: events_pb2.Envelope) -> None:
        cls = _MESSAGES.get(envelope.topic)
        if cls is None or envelope.namespace not in self.namespaces:
            return
        try:
            event = cls.FromString(envelope.event.value)
        except Exception as exc:  # a payload we cannot read: say so, keep the stream
            self.log.debug("Cannot decode %s event: %s", envelope.topic, exc)
            return
        await self._judge(client, envelope.topic, event.name, envelope.namespace,
                          dict(getattr(event, "labels", {}) or {}))

    async def _judge(self, client: ContainerdClient, topic: str, name: str, namespace: str,
                     labels: Mapping[str, str]) -> None:
        owners = owners_of(self.records())
        path = drifted(topic, name, labels, owners, pin=self.pin)
        if path is None:
            return
        # The file busy with this image: its owner, or the file its source label names (a .txt pulling or
        # relabelling an image a tarball imported, not recorded as an owner until its answer lands).
        source = labels.get(SOURCE_LABEL)
        for busy in (path, Path(source) if source else None):
            if busy is not None and self.busy(busy):
                self._stash[(name, namespace)] = (topic, busy)  # judged once its import or pull answered
                return
        # Events arrive after the fact: reloadd's own import or pull may have created the image
        # unlabelled and labelled it since (a CRI pull does), or put a deleted one back. Only what
        # containerd holds now is drift.
        now = await client.get_image(name, namespace)
        if now is None and topic != "/images/delete":
            return  # gone since: its delete event follows
        if now is not None and drifted("/images/update", name, dict(now.labels), owners, pin=self.pin) is None:
            return
        if now is None:
            why = "deleted"
        elif self.pin and now.labels.get(PIN_LABEL) != "pinned":
            why = "unpinned"
        else:
            why = "relabelled"
        self._emit(path, name, why)

    def settled(self, path: Path) -> None:
        """The consumer finished ``path``: judge the events that arrived meanwhile against containerd now."""
        client = self._client
        waiting = [(key, topic) for key, (topic, p) in self._stash.items() if p == path]
        if client is None or not waiting:
            return
        for key, _topic in waiting:
            del self._stash[key]

        async def judge() -> None:
            for (name, namespace), topic in waiting:
                try:
                    await self._judge(client, "/images/update" if topic != "/images/delete" else topic, name,
                                      namespace, {})
                except TransientError as exc:
                    self.log.debug("Cannot check %s after %s: %s", name, path, exc)

        task = asyncio.get_running_loop().create_task(judge())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
