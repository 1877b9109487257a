"""Change sources: inotify, the periodic rescan and signals, each behind :class:`Source`."""

from .._source import Coverage, EventKind, Source, SourceContext, SourceEvent, WatchRoot

__all__ = ["Coverage", "EventKind", "Source", "SourceContext", "SourceEvent", "WatchRoot"]
