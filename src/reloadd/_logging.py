"""Log formatting for the CLI: text for a terminal, JSON lines for collectors."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JSONFormatter", "configure_logging"]


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception text)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(fmt: str = "text", level: str = "info") -> None:
    """Configure the root logger (called by the CLI only, never by the library)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
