"""Order across files: an object whose Namespace or CRD another file is about to create waits for that file.

Within a file, ``_ordering`` ranks the objects (CRDs, then Namespaces, ...). Across files it is this gate:
before a file is applied, the files of the folder that declare a Namespace or a CustomResourceDefinition
and are about to be applied (handed over in a batch now, or new since start-up) are its *providers*; a
file whose objects name such a namespace (``metadata.namespace``) or such a kind waits until its provider
was applied (for a CRD that includes Established: the applier waits for it), then applies once, without
a 404, a WARNING or a retry backoff. ``kubectl apply -f DIR`` gets the same from lexical order and one
object at a time; this keeps the folder's concurrency.

Providers never wait (a file that both declares a namespace and uses another's applies in rank order and
retries on its own, as before), so two files cannot wait for each other; a waiter gives up after
``timeout`` seconds and applies anyway (a provider whose apply failed also releases it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from pathlib import Path

from ._manifests import Manifest

__all__ = ["MARKERS", "Gate", "Key", "needs", "provides"]

Key = tuple[str, str]
"""``("namespace", name)`` or ``("kind", "group/Kind")``."""

MARKERS = (b"Namespace", b"CustomResourceDefinition")
"""A file without either byte string declares no provider: it is not parsed to find out."""
WAVE = "reloadd.io/wave"
"""The annotation that puts an object in a wave (an integer, default 0; Argo CD's ``sync-wave`` convention)."""


class WaveError(ValueError):
    """An object's wave annotation is not an integer."""


def wave_of(manifest: Manifest) -> int:
    """The wave of a file: the highest ``reloadd.io/wave`` of its objects (0 when none has one).

    A file is one ApplySet, applied at once: it goes in the wave of its latest object.

    Raises:
        WaveError: naming the object whose annotation is not an integer.
    """
    wave: int | None = None
    for obj in manifest.objects:
        value = ((obj.body.get("metadata") or {}).get("annotations") or {}).get(WAVE)
        if value is None:
            continue
        try:
            n = int(str(value).strip())
        except ValueError as exc:
            raise WaveError(f"{obj.where} {obj.kind}: annotation {WAVE} must be an integer, got {value!r}") from exc
        wave = n if wave is None else max(wave, n)
    return wave or 0


def provides(manifest: Manifest) -> set[Key]:
    """The namespaces and custom kinds ``manifest`` creates."""
    out: set[Key] = set()
    for obj in manifest.objects:
        group = obj.api_version.rpartition("/")[0]
        name = str((obj.body.get("metadata") or {}).get("name") or "")
        if obj.kind == "Namespace" and group == "":
            out.add(("namespace", name))
        elif obj.kind == "CustomResourceDefinition" and group == "apiextensions.k8s.io":
            spec = obj.body.get("spec") or {}
            kind = (spec.get("names") or {}).get("kind") if isinstance(spec, dict) else None
            if kind:
                out.add(("kind", f"{spec.get('group') or ''}/{kind}"))
    return out


def needs(manifest: Manifest) -> set[Key]:
    """The namespaces and kinds the objects of ``manifest`` need (less what it provides itself)."""
    out: set[Key] = set()
    for obj in manifest.objects:
        ns = (obj.body.get("metadata") or {}).get("namespace")
        if isinstance(ns, str) and ns:
            out.add(("namespace", ns))
        out.add(("kind", f"{obj.api_version.rpartition('/')[0]}/{obj.kind}"))
    return out - provides(manifest)


class Gate:
    """Files about to create a namespace or a kind, and the files that wait for them.

    Args:
        timeout: Seconds a file waits for its providers at most.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._by_key: dict[Key, set[Path]] = {}
        self._done: dict[Path, asyncio.Event] = {}
        self.waited = 0
        """Files that waited for a provider (a counter for stats)."""

    def expect(self, path: Path, keys: Iterable[Key]) -> None:
        """``path`` is about to be applied and creates ``keys``."""
        keys = set(keys)
        if not keys:
            return
        self._done.setdefault(path, asyncio.Event())
        for key in keys:
            self._by_key.setdefault(key, set()).add(path)

    def done(self, path: Path) -> None:
        """``path`` was applied (or gave up): what waits for it goes on."""
        event = self._done.pop(path, None)
        if event is None:
            return
        event.set()
        for key in [k for k, paths in self._by_key.items() if path in paths]:
            self._by_key[key].discard(path)
            if not self._by_key[key]:
                del self._by_key[key]

    def providing(self, path: Path) -> bool:
        """Whether ``path`` is expected to create something (it never waits)."""
        return path in self._done

    async def wait(self, path: Path, keys: Iterable[Key]) -> bool:
        """Wait until the providers of ``keys`` (other than ``path``) are applied; whether there were any."""
        if self.providing(path):
            return False
        events = {self._done[p] for k in keys for p in self._by_key.get(k, ()) if p != path and p in self._done}
        if not events:
            return False
        self.waited += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), self.timeout)
        return True
