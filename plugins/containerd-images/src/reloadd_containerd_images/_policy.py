"""The ``verify`` policy of one consumer: judge a file before anything of it reaches containerd.

``off`` (the default) imports as before. ``warn`` and ``require`` hash the file once, through the
descriptor the import then reads (a file renamed over it meanwhile cannot swap the bytes), and judge
the evidence beside it (:mod:`._evidence`). A file with no evidence at all waits up to
``verify_wait`` for it (the consumer defers it: status lists it as *deferred*); a signature or checksum
file arriving later hands it over again. Then ``require`` refuses it, whole: nothing is written to
containerd. ``warn`` says the same words and imports.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from reloadd import JSONValue

from ._evidence import Refusal, Verdict, evidence_present, judge, sha256_fd, sha256_file
from ._keys import KeyFileError, Keyring, load_keys

__all__ = ["KEY_LABEL", "MODES", "OVERLAP_FROM", "VIA_LABEL", "Decision", "Policy", "open_for_check"]

MODES = ("off", "warn", "require")
KEY_LABEL = "reloadd.io/verified-key"
"""Image label: the trusted key that verified the file it came from (``SHA256:<cosign key id>``)."""
OVERLAP_FROM = 64 << 20
"""From this size on, a file with evidence beside it is hashed *while* it is imported (same descriptor, a
second thread) and judged before any image record is written; a refusal then deletes the import's lease at
once, which takes its content and snapshots with it. Smaller files are judged before their first byte is sent."""
VIA_LABEL = "reloadd.io/verified-by"
"""Image label: the evidence file that verified it (``web.tar.sig``, ``sha256sum-amd64.txt (….sig)``)."""


@dataclass(frozen=True)
class Decision:
    """What to do with one file.

    Attributes:
        verdict: What its evidence says (``None`` when ``verify = "off"``).
        wait: Seconds to wait for evidence still missing (0: decide now).
        refused: The ``REFUSED …; nothing imported`` line (``require``), or "".
        warning: The same words for ``warn`` (the import goes on), or "".
    """

    verdict: Verdict | None = None
    wait: float = 0.0
    refused: str = ""
    warning: str = ""

    @property
    def labels(self) -> dict[str, str]:
        """The provenance labels of the images made from the file (none unless verified)."""
        v = self.verdict
        if v is None or v.key is None:
            return {}
        return {KEY_LABEL: v.key.shown, VIA_LABEL: v.via}

    @property
    def record(self) -> JSONValue:
        """What the consumer's records keep about the check (``None`` when not checked)."""
        v = self.verdict
        if v is None:
            return None
        if v.key is not None:
            return {"digest": f"sha256:{v.digest}", "key": v.key.shown, "by": v.via}
        return {"digest": f"sha256:{v.digest}", "unverified": v.why}


def refusal_line(word: str, shown: str, verdict: Verdict, why: str, keyring: Keyring, tail: str) -> str:
    """``REFUSED images/web.tar (sha256:…): <why> (keys SHA256:…; checked web.tar.sig); nothing imported``."""
    checked = f"; checked {verdict.via}" if verdict.via else ""
    return f"{word} {shown} (sha256:{verdict.digest}): {why} (keys {keyring.shown}{checked}); {tail}"


class Policy:
    """The verify policy of one consumer.

    Args:
        mode: ``off``, ``warn`` or ``require``.
        patterns: The ``trusted_keys`` globs (re-read by :meth:`reload`).
        base: Where relative globs start (the configuration file's folder).
        keyring: The keys read at load time.
        wait: Seconds a file without evidence waits for it.
        log: The consumer's logger.
        clock: Monotonic seconds (injectable).
    """

    def __init__(self, mode: str, patterns: Sequence[str], base: Path | None, keyring: Keyring, wait: float,
                 log: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self.mode = mode
        self.patterns = tuple(patterns)
        self.base = base
        self.keyring = keyring
        self.wait = wait
        self.log = log
        self.clock = clock
        self.key_error = ""
        """Why the last reload failed ("" when it did not): every file is retried until it is fixed."""
        self._first_seen: dict[Path, tuple[object, float]] = {}
        self.overlap_from = OVERLAP_FROM

    @property
    def on(self) -> bool:
        """Whether files are checked at all."""
        return self.mode != "off"

    def reload(self) -> None:
        """Read the key files again (SIGHUP): a key removed is no longer trusted, a key added is.

        A key that cannot be read now stops every import (retried) rather than falling back on the
        old set, which may hold the very key being revoked.
        """
        if not self.on:
            return
        try:
            keyring = load_keys(self.patterns, self.base)
        except KeyFileError as exc:
            self.key_error = f"trusted_keys: {exc}"
            self.log.error("Failed to reload trusted keys (no file is imported until they load): %s", exc)
            return
        if keyring != self.keyring:
            self.log.info("Trusted keys reloaded: %s", keyring.shown)
        self.keyring, self.key_error = keyring, ""

    def forget(self, path: Path) -> None:
        """Drop what is remembered of ``path`` (it was deleted or handled for good)."""
        self._first_seen.pop(path, None)

    def overlaps(self, path: Path, fd: int) -> bool:
        """Whether the check of this file rides its import's read (see :data:`OVERLAP_FROM`)."""
        return (self.on and not self.key_error and os.fstat(fd).st_size >= self.overlap_from
                and evidence_present(path))

    def _left(self, path: Path, identity: object) -> float:
        """Seconds ``path`` (as ``identity``) may still wait for its evidence."""
        now = self.clock()
        seen = self._first_seen.get(path)
        if seen is None or seen[0] != identity:
            seen = self._first_seen[path] = (identity, now)
        return seen[1] + self.wait - now

    async def decide(self, path: Path, shown: str, fd: int | None = None, identity: object = None, *,
                     planning: bool = False, digest: tuple[str, int] | None = None) -> Decision:
        """Judge ``path`` (read through ``fd`` when given); ``identity`` restarts the wait when the file changes.

        Args:
            planning: For ``reloadd plan``: never wait, say what the wait's end would do.
            digest: The file's SHA-256 (hex) and size when already known (else it is hashed here).
        """
        if not self.on:
            return Decision()
        if not planning and digest is None and not await asyncio.to_thread(evidence_present, path):
            left = self._left(path, identity)  # nothing to judge yet: wait without reading the file
            if left > 0:
                return Decision(wait=left)
        verdict = await asyncio.to_thread(self._judge, path, fd, digest)
        if verdict.verified:
            self.forget(path)
            return Decision(verdict)
        why = verdict.why
        if verdict.missing and not planning:
            left = self._left(path, identity)
            if left > 0:
                return Decision(verdict, wait=left)
            why += f", within verify_wait ({self.wait:g}s)"
        elif verdict.missing:
            why += f" (it waits up to {self.wait:g}s for one)"
        self.forget(path)
        # A copy a checksum file lists with another digest is truncated or corrupt: refused under warn too.
        if self.mode == "require" or verdict.refusal is Refusal.DIGEST_MISMATCH:
            return Decision(verdict, refused=refusal_line("REFUSED", shown, verdict, why, self.keyring,
                                                          "nothing imported"))
        return Decision(verdict, warning=refusal_line("UNVERIFIED", shown, verdict, why, self.keyring,
                                                      'imported anyway (verify = "warn")'))

    def _judge(self, path: Path, fd: int | None, known: tuple[str, int] | None) -> Verdict:
        digest, size = known or (sha256_fd(fd) if fd is not None else sha256_file(path))
        return judge(path, self.keyring, digest, size)

    def refused_line(self, shown: str, verdict: Verdict, why: str) -> str:
        """A refusal line for a reason found outside the evidence (unpinned list lines)."""
        require = self.mode == "require"
        word, tail = ("REFUSED", "those lines not pulled") if require else ("UNVERIFIED", "pulled anyway")
        return refusal_line(word, shown, verdict, why, self.keyring, tail)


def open_for_check(path: Path) -> int:
    """An fd of ``path``: it is hashed through it, and the import reads ``/proc/self/fd/<fd>`` (same inode)."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
