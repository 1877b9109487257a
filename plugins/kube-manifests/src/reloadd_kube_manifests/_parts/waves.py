"""Files that wait for others: the providers of namespaces and CRDs first, then ``reloadd.io/wave`` order.

A part of :class:`~reloadd_kube_manifests.KubeManifestsConsumer` (see ``_parts``); the gate itself is
``_gate``'s :class:`~reloadd_kube_manifests._gate.Gate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from reloadd import ReloaddError

from .._gate import MARKERS, WAVE, WaveError, provides, wave_of
from .._health import FileState
from .._manifests import load_manifest
from .base import SKIP_SUFFIX, ConsumerBase

__all__ = ["WavePart"]


class WavePart(ConsumerBase):
    """Registers the files that provide namespaces and CRDs, and holds a file until earlier waves are current."""

    async def _expect_new_providers(self) -> None:
        """Files of the folder never applied that declare a Namespace or a CRD: the start-up pass is about to
        apply them, whatever batch they come in, so the files that need them wait for them (see ``_gate``)."""
        paths = [p for p in await asyncio.to_thread(self._present_files)
                 if p not in self.ctx.records and p.suffix.lower() != SKIP_SUFFIX]
        await self._expect(paths)

    async def _expect(self, paths: Sequence[Path], *, waves: bool = False) -> set[Path]:
        """Register those of ``paths`` that declare a Namespace or a CRD with the gate (returns them), and with
        ``waves`` the wave of each (files handed over now: the later waves wait for them)."""
        found = await asyncio.to_thread(_may_provide, paths)
        out: set[Path] = set()
        for path in paths:
            if waves:
                self._waves.pop(path, None)
            if path not in found:
                if waves:
                    self._wave_pending[path] = 0
                continue
            try:
                manifest = await load_manifest(path, max_bytes=self.settings.max_file_size)
            except ReloaddError:
                continue  # its own pass reports it
            keys = provides(manifest)
            if keys:
                self._gate.expect(path, keys)
                out.add(path)
            if waves:
                with contextlib.suppress(WaveError):  # its own pass rejects it
                    wave = wave_of(manifest)
                    self._wave_pending[path] = wave
                    if wave:
                        self._waves[path] = wave
        return out

    async def _wait_wave(self, path: Path, wave: int) -> None:
        """Wait until no file of an earlier wave is about to be applied, applying or progressing (failed and
        current ones release it), ``health_timeout`` at most."""
        deadline = time.monotonic() + self.settings.health_timeout
        logged = False
        while True:
            blockers = [p for p, w in self._wave_pending.items() if w < wave and p != path] + [
                p for p, f in self._book.files.items() if p != path and self._waves.get(p, 0) < wave
                and f.state in (FileState.APPLYING, FileState.PROGRESSING)]
            left = deadline - time.monotonic()
            if not blockers:
                return
            if left <= 0:
                self.log.warning("Applying %s (wave %d) although %s of an earlier wave is not current after "
                                 "health_timeout", path, wave, blockers[0])
                return
            if not logged:
                logged = True
                self.log.info("%s (wave %d) waits for %d file(s) of earlier waves, e.g. %s", path, wave,
                              len(blockers), blockers[0])
            self._wave_moved.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wave_moved.wait(), left)


def _may_provide(paths: Sequence[Path]) -> list[Path]:
    """Those of ``paths`` whose bytes name a Namespace or a CRD (the others are not parsed to find out)."""
    out = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(m in data for m in MARKERS) or WAVE.encode() in data:
            out.append(path)
    return out
