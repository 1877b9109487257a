"""The reloadd exception tree.

Every error reloadd raises on purpose derives from :class:`ReloaddError`; foreign
errors (``OSError``, ``GRPCError``, HTTP statuses) are mapped onto it at the
boundary where they occur, with ``raise ... from exc`` so the cause stays visible::

    ReloaddError
    ├── ConfigError            bad configuration file, key, type or plugin option
    ├── PluginError            a plugin could not be found, loaded or validated
    ├── WatchError             the watch could not be armed or died
    │   └── WatchLimitError    an inotify kernel limit (ENOSPC / EMFILE) was hit
    ├── StateError             the state directory could not be read or written
    ├── PlanUnsupportedError   a consumer cannot say what it would change (``reloadd plan``)
    └── ConsumerError          a consumer failed to act on a path
        ├── TransientError     worth retrying with backoff (a socket down, a 503)
        └── PermanentError     retrying cannot help until the file changes
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConsumerError",
    "PermanentError",
    "PlanUnsupportedError",
    "PluginError",
    "ReloaddError",
    "StateError",
    "TransientError",
    "WatchError",
    "WatchLimitError",
]


class ReloaddError(Exception):
    """Root of every error reloadd raises on purpose."""


class ConfigError(ReloaddError):
    """The configuration (file, key, type or plugin option) is invalid."""


class PluginError(ReloaddError):
    """A plugin could not be discovered, imported or validated."""


class WatchError(ReloaddError):
    """The filesystem watch could not be armed, or failed while running."""


class WatchLimitError(WatchError):
    """An inotify kernel limit was reached.

    These are persistent, not transient: retrying at once would spin, so the engine
    degrades to rescan-only and says which sysctl to raise.
    """

    def __init__(self, message: str, sysctl: str) -> None:
        super().__init__(message)
        self.sysctl = sysctl


class StateError(ReloaddError):
    """The state directory could not be read or written.

    Attributes:
        path: The file concerned, when known.
        cause: The cause alone (``No space left on device``), when known: what persist failures are
            counted and rate-limited by.
    """

    def __init__(self, message: str, *, path: str | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.cause = cause


class PlanUnsupportedError(ReloaddError):
    """A consumer cannot tell what it would change without doing it (``exec`` runs any command).

    ``reloadd plan`` reports the message for that consumer; it does not count as an error.
    """


class ConsumerError(ReloaddError):
    """A consumer failed to act on a path."""


class TransientError(ConsumerError):
    """A failure worth retrying with backoff (service down, timeout, 5xx).

    Attributes:
        retry_after: Seconds the far side asked to wait (``Retry-After``), if it said; the retry
            waits at least that long (capped by the backoff's maximum).
    """

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(ConsumerError):
    """A failure no retry can fix until the file changes (corrupt or invalid input)."""
