"""The consumer: keep the served SSLContext equal to the newest matching cert/key pair on disk."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path

from reloadd import Ack, BaseConsumer, Batch, ConsumerContext, Reject, Result

from ._pair import Pair, PairError, load_pair, read_files

__all__ = ["CertPair"]


class CertPair(BaseConsumer):
    """Watch a certificate and its key; serve the pair once both halves match.

    The unit is the pair, not the file: whichever of the two paths a batch carries,
    both files are read again and loaded together, so the pair ends right whether its
    halves settle in one batch (written 20 ms apart) or in two (3 s apart).

    Args:
        cert: The certificate (chain) file.
        key: Its private key file.
        first: The pair loaded at start-up, served until a new one loads.
    """

    concurrency = 1
    """One batch at a time, so pairs are swapped in the order their changes settled."""

    def __init__(self, cert: Path, key: Path, first: Pair) -> None:
        super().__init__(ConsumerContext(
            name="tls", paths=(cert, key), options={}, state_dir=cert.parent,
            logger=logging.getLogger("tls_reloader"),
        ))
        self.cert = cert
        self.key = key
        self.serving = first
        self.front = first.context
        """The context to give the server (aiohttp ``TCPSite``): it hands every handshake the current pair."""
        self.front.sni_callback = self._select
        self._rejected: set[Path] = set()

    def group(self, path: Path) -> str | None:
        """Both halves are one group: written together, they settle together and arrive in one batch."""
        return "pair" if path in (self.cert, self.key) else None

    def accepts(self, path: Path) -> bool:
        return path in (self.cert, self.key)

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        files = await asyncio.to_thread(read_files, self.cert, self.key)
        try:
            pair = await asyncio.to_thread(load_pair, files)
        except PairError as exc:
            return self._keep_serving(batch, files.sha256, exc)
        if pair.files != self.serving.files:
            self.log.info("Serving %s from %s and %s", pair, self.cert, self.key)
            self.serving = pair
        # A half rejected earlier belongs to this pair now: hand it over again so its
        # record (``reloadd status``) no longer shows the rejection.
        stale, self._rejected = self._rejected - set(batch.paths), set()
        if stale:
            self.ctx.trigger(stale)
        return {p: Ack({"sha256": pair.fingerprint}) for p in batch.paths}

    def _keep_serving(self, batch: Batch, sha256: Callable[[Path], str | None],
                      exc: PairError) -> dict[Path, Result]:
        """Half-rotated, mid-write or deleted: the old pair stays in service.

        Only a half that differs from the served pair is rejected: reloadd logs that as
        one WARNING line and does not retry it, and the other half's own change hands
        the pair over again and completes it. A half still equal to the served pair is
        not at fault and is acknowledged.
        """
        results: dict[Path, Result] = {}
        for path in batch.paths:
            if sha256(path) == self.serving.files.sha256(path):
                results[path] = Ack({"sha256": self.serving.fingerprint})
            else:
                self._rejected.add(path)
                results[path] = Reject(f"{exc}; still serving {self.serving}")
        return results

    def _select(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                front: ssl.SSLContext) -> None:
        # OpenSSL calls this for every ClientHello, SNI or not: switch the connection
        # to the pair being served now. Connections already up keep their pair.
        conn.context = self.serving.context
