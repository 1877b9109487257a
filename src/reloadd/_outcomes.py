"""The core's one error policy: an exception raised for a path becomes that path's result.

Used by the work queue (a batch whose ``handle()`` raised, split path by path) and by
:meth:`BaseConsumer.handle`'s per-path fan-out (a ``handle_one()`` that raised), so a plugin
never maps exceptions itself: :class:`~reloadd.PermanentError` rejects the path until it
changes, anything else retries it with backoff. Expected failures (the
:class:`~reloadd.ConsumerError` tree) are one line, logged by the queue with the result
(their traceback at DEBUG here); anything else is a bug worth a traceback at ERROR.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ._errors import ConsumerError, PermanentError
from ._types import Reject, Result, Retry

__all__ = ["result_of"]

log = logging.getLogger("reloadd.queue")


def result_of(exc: Exception, consumer: str, path: Path | str) -> Result:
    """The result the core gives ``path`` of ``consumer`` when handling it raised ``exc``."""
    if isinstance(exc, ConsumerError):
        log.debug("Consumer %s raised for %s", consumer, path, exc_info=exc)
        error = str(exc) or type(exc).__name__
        return Reject(error) if isinstance(exc, PermanentError) else Retry(error)
    log.error("Failed to handle %s in consumer %s: %s", path, consumer, exc, exc_info=exc)
    return Retry(f"{type(exc).__name__}: {exc}")
