"""The one daemon configuration the tests write: ``reloadd.toml`` for a ``reloadd run`` in another process."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["hook_daemon_config", "write_config"]


def _literal(value: Any) -> str:
    """A TOML literal for a str/int/float/bool/Path or a list of them (JSON's spelling is TOML's for these)."""
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return json.dumps(value)


def write_config(path: Path, reloadd: dict[str, Any], consumers: Sequence[dict[str, Any]]) -> Path:
    """Write ``path``: a ``[reloadd]`` table, and ``[[consumer]]`` tables (``options``: ``[consumer.options]``)."""
    lines = ["[reloadd]"]
    lines += [f"{k} = {_literal(v)}" for k, v in reloadd.items() if v is not None]
    for c in consumers:
        lines.append("[[consumer]]")
        lines += [f"{k} = {_literal(v)}" for k, v in c.items() if k != "options"]
        lines.append("[consumer.options]")
        lines += [f"{k} = {_literal(v)}" for k, v in c.get("options", {}).items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def hook_daemon_config(tmp_path: Path, root: Path, *, hook: str | None = None, command: Sequence[str] | None = None,
                       **settings: Any) -> Path:
    """The exec-hook daemon most daemon tests run; its ``reloadd.toml`` (in ``tmp_path``).

    State in ``tmp_path/state``, ``quiet = "100ms"``, and one ``exec`` consumer ``hook`` on ``root``
    running ``hook`` (Python source, written to ``tmp_path/hook.py``) or ``command``. ``settings``
    add to or override the ``[reloadd]`` table (``control_socket=…``, ``rescan_interval="1s"``…).
    """
    if hook is not None:
        (tmp_path / "hook.py").write_text(hook)
        command = [sys.executable, str(tmp_path / "hook.py")]
    assert command is not None, "a hook or a command"
    reloadd = {"state_dir": tmp_path / "state", "quiet": "100ms", **settings}
    consumer = {"name": "hook", "plugin": "exec", "paths": [root], "options": {"command": list(command)}}
    return write_config(tmp_path / "reloadd.toml", reloadd, [consumer])
