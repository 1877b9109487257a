"""The core's one error policy: an exception raised for a path becomes that path's result.

Used by the work queue (a batch whose ``handle()`` raised, split path by path) and by
:meth:`BaseConsumer.handle`'s per-path fan-out (a ``handle_one()`` that raised), so a plugin
never maps exceptions itself: :class:`~reloadd.PermanentError` rejects the path until it
changes, anything else retries it with backoff (a :class:`~reloadd.TransientError`'s
``retry_after`` respected). Errors raised on purpose (the :class:`~reloadd.ReloaddError`
tree: a consumer's, a configuration's, a state directory's) are one line, logged by the
queue with the result (their traceback at DEBUG here); anything else is a bug worth a
traceback at ERROR.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from ._errors import ConsumerError, PermanentError, ReloaddError, TransientError
from ._types import Reject, Retry

__all__ = ["result_of"]

log = logging.getLogger("reloadd.queue")


def result_of(exc: Exception, consumer: str, path: Path | str, *, name_path: bool = False) -> Retry | Reject:
    """The result the core gives ``path`` of ``consumer`` when handling it raised ``exc``.

    ``name_path``: the error starts with the path (``/images/app.tar: not a tar archive``), for a
    consumer whose errors are read apart from their path (its records, ``reloadd plan``).
    """
    result = _result_of(exc, consumer, path)
    if name_path:
        return replace(result, error=f"{path}: {result.error}")
    return result


def _result_of(exc: Exception, consumer: str, path: Path | str) -> Retry | Reject:
    if isinstance(exc, ConsumerError):
        log.debug("Consumer %s raised for %s", consumer, path, exc_info=exc)
        error = str(exc) or type(exc).__name__
        if isinstance(exc, PermanentError):
            return Reject(error)
        return Retry(error, after=exc.retry_after if isinstance(exc, TransientError) else None)
    if isinstance(exc, ReloaddError):  # raised on purpose (configuration, state): one line, retried
        log.debug("Consumer %s raised for %s", consumer, path, exc_info=exc)
        return Retry(str(exc) or type(exc).__name__)
    log.error("Failed to handle %s in consumer %s: %s", path, consumer, exc, exc_info=exc)
    return Retry(f"{type(exc).__name__}: {exc}")
