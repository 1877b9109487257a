"""Typed, strict reading of TOML tables: every key checked, unknown keys rejected."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ._errors import ConfigError
from ._suggest import did_you_mean

__all__ = ["MAX_DURATION", "Options", "parse_duration"]

T = TypeVar("T")
_Str = str
_Bool = bool
_Int = int

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")

MAX_DURATION = 30 * 24 * 3600.0
"""The longest duration any option accepts (30 days).

Longer values are typos, not intent, and some overflow the timeouts they end up in
(``threading`` waits reject more than ~292 years, ``loop.call_at`` silently never fires).
"""


def parse_duration(value: object, where: str, *, minimum: float = 0.0, maximum: float = MAX_DURATION) -> float:
    """Parse ``"200ms"``, ``"15s"``, ``"1.5m"``, ``"2h"`` (or a bare number of seconds).

    TOML also has bare ``nan`` and ``inf`` floats; both are refused, because a ``nan``
    quiet period compares false with every deadline and nothing would ever be delivered.

    Args:
        value: The raw TOML value.
        where: How to name the file and key in error messages.
        minimum: The smallest accepted value in seconds.
        maximum: The largest accepted value in seconds (default :data:`MAX_DURATION`).

    Returns:
        Seconds as a finite float in ``[minimum, maximum]``.

    Raises:
        ConfigError: naming ``where`` when the value is not such a duration.
    """
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            seconds = float(m.group(1)) * _UNITS[m.group(2)]
        elif value.strip() == "0":
            seconds = 0.0  # "0" needs no unit
    if seconds is None or math.isnan(seconds):
        raise ConfigError(f"{where}: expected a duration like \"200ms\" or \"15s\", got {value!r}")
    if seconds < 0:
        raise ConfigError(f"{where}: duration must not be negative, got {value!r}")
    if not math.isfinite(seconds) or seconds > maximum:
        raise ConfigError(f"{where}: duration must be at most {_show(maximum)}, got {value!r}")
    if seconds < minimum:
        raise ConfigError(f"{where}: duration must be at least {_show(minimum)}, got {value!r}")
    return seconds


def _show(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms"


_TYPE_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}


class Options:
    """Read a TOML table key by key, with types checked and unknown keys rejected.

    Example:
        >>> opts = Options({"address": "/run/x.sock", "workers": 2}, where="consumer 'img' options")
        >>> opts.str("address")
        '/run/x.sock'
        >>> opts.int("workers", default=1)
        2
        >>> opts.finish()

    Args:
        table: The table as parsed from TOML.
        where: How to name the table in error messages (include the file name).
    """

    def __init__(self, table: Mapping[_Str, Any], where: _Str) -> None:
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: expected a table, got {type(table).__name__}")
        self._table = dict(table)
        self._seen: set[_Str] = set()
        self.where = where

    def _get(self, key: _Str, kinds: tuple[type, ...], default: Any, required: _Bool) -> Any:
        self._seen.add(key)
        if key not in self._table:
            if required:
                raise ConfigError(f"{self.where}: missing required key {key!r}")
            return default
        value = self._table[key]
        ok = isinstance(value, kinds) and not (isinstance(value, _Bool) and _Bool not in kinds)
        if not ok:
            expected = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
            raise ConfigError(
                f"{self.where}: key {key!r} must be {expected}, got {type(value).__name__} {value!r}"
            )
        return value

    def has(self, key: _Str) -> _Bool:
        """Whether the table sets ``key`` (marks it as known)."""
        self._seen.add(key)
        return key in self._table

    def str(self, key: _Str, default: _Str | None = None, *, required: _Bool = False) -> Any:
        """A string value (``default`` when absent)."""
        return self._get(key, (_Str,), default, required)

    def bool(self, key: _Str, default: _Bool = False) -> _Bool:
        """A boolean value."""
        return bool(self._get(key, (_Bool,), default, False))

    def int(
        self, key: _Str, default: _Int | None = None, *, minimum: _Int | None = None, maximum: _Int | None = None
    ) -> Any:
        """An integer value, optionally within ``[minimum, maximum]``."""
        value = self._get(key, (_Int,), default, False)
        if value is not None and minimum is not None and value < minimum:
            raise ConfigError(f"{self.where}: key {key!r} must be at least {minimum}, got {value}")
        if value is not None and maximum is not None and value > maximum:
            raise ConfigError(f"{self.where}: key {key!r} must be at most {maximum}, got {value}")
        return value

    def number(
        self, key: _Str, default: float | None = None, *, minimum: float | None = None, maximum: float | None = None
    ) -> Any:
        """A finite number (TOML integer or float), optionally within ``[minimum, maximum]``.

        TOML's ``nan`` and ``inf`` are refused: they pass every ``<`` check unnoticed.
        """
        value = self._get(key, (_Int, float), default, False)
        if value is None:
            return None
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{self.where}: key {key!r} must be a finite number, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(f"{self.where}: key {key!r} must be at least {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{self.where}: key {key!r} must be at most {maximum:g}, got {value:g}")
        return value

    def duration(
        self, key: _Str, default: float | None = None, *, minimum: float = 0.0, maximum: float = MAX_DURATION
    ) -> Any:
        """A duration string such as ``"500ms"``, returned in seconds (finite, within the bounds)."""
        self._seen.add(key)
        if key not in self._table:
            return default
        return parse_duration(self._table[key], f"{self.where}: key {key!r}", minimum=minimum, maximum=maximum)

    def path(self, key: _Str, default: _Str | Path | None = None, *, base: Path | None = None) -> Any:
        """A filesystem path; relative paths are resolved against ``base`` when given.

        Absolute results are normalised lexically (``/a/b/../c`` is ``/a/c``).
        """
        raw = self._get(key, (_Str,), None if default is None else str(default), False)
        if raw is None:
            return None
        p = Path(raw).expanduser()
        if not p.is_absolute() and base is not None:
            p = base / p
        return Path(os.path.normpath(p)) if p.is_absolute() else p

    def str_list(self, key: _Str, default: Sequence[_Str] = ()) -> list[_Str]:
        """A list of strings."""
        value = self._get(key, (list,), list(default), False)
        for i, item in enumerate(value):
            if not isinstance(item, _Str):
                raise ConfigError(
                    f"{self.where}: key {key!r}[{i}] must be a string, got {type(item).__name__} {item!r}"
                )
        return list(value)

    def table(self, key: _Str) -> dict[_Str, Any]:
        """A sub-table (empty when absent)."""
        return dict(self._get(key, (dict,), {}, False))

    def choice(self, key: _Str, choices: Sequence[_Str], default: _Str) -> _Str:
        """A string restricted to ``choices``."""
        value = self.str(key, default)
        if value not in choices:
            raise ConfigError(
                f"{self.where}: key {key!r} must be one of {', '.join(map(repr, choices))}, got {value!r}"
            )
        return str(value)

    def finish(self) -> None:
        """Raise :class:`ConfigError` if the table has keys nobody asked for."""
        unknown = sorted(set(self._table) - self._seen)
        if unknown:
            named = ", ".join(f"{k!r}{did_you_mean(k, self._seen)}" for k in unknown)
            raise ConfigError(f"{self.where}: unknown key(s) {named}")
