"""Change sources: inotify, the periodic rescan and signals, each behind :class:`Source`."""

from .base import EventKind, Source, SourceContext, SourceEvent, WatchRoot

__all__ = ["EventKind", "Source", "SourceContext", "SourceEvent", "WatchRoot"]
