"""'Did you mean' for names a person typed: config keys, plugin options, plugin and consumer names."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'quiet'?)"`` for the closest of ``choices`` to ``name``, or ``""`` when none is close."""
    import difflib  # only when a name was mistyped

    close = difflib.get_close_matches(name, sorted(set(choices)), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
