"""Shared by the ``reloadd plan`` tests: a config file, the real CLI, and the real pass it predicts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from reloadd import Reloader, load_config

PLAN_TIMEOUT = 120.0


def toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)  # strings, numbers, booleans and lists read the same in TOML


def write_config(tmp_path: Path, *consumers: dict[str, Any], state_dir: str = "state") -> Path:
    """A config file in ``tmp_path``; each consumer is a dict with ``options`` as a sub-dict."""
    lines = ["[reloadd]", f"state_dir = {toml_value(str(tmp_path / state_dir))}", 'quiet = "50ms"']
    for c in consumers:
        lines.append("[[consumer]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in c.items() if k != "options"]
        lines.append("[consumer.options]")
        lines += [f"{k} = {toml_value(v)}" for k, v in c.get("options", {}).items()]
    path = tmp_path / "reloadd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def run_plan(config: Path, *extra: str) -> tuple[int, Any, str]:
    """``reloadd plan --config FILE --json`` in a child process: exit code, the JSON document, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reloadd", "plan", "--config", str(config), "--json", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), PLAN_TIMEOUT)
    assert proc.returncode is not None
    doc = json.loads(out) if out.strip() else None
    return proc.returncode, doc, err.decode()


async def run_text_plan(config: Path) -> tuple[int, str]:
    """The human form: exit code and stdout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reloadd", "plan", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), PLAN_TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def real_pass(config: Path, timeout: float = 60.0) -> Reloader:
    """Start a reloader on ``config``, let the start-up pass finish, stop it; returns it (closed)."""
    r = Reloader(load_config(config))
    async with r:
        await r.wait_idle(timeout)
    return r


def consumer_doc(doc: Any, name: str) -> Any:
    (found,) = [c for c in doc["consumers"] if c["name"] == name]
    return found


def pending(doc: Any, name: str) -> set[tuple[str, str]]:
    return {(p["path"], p["kind"]) for p in consumer_doc(doc, name)["pending"]}


def planned(doc: Any, name: str) -> set[tuple[str, str, str]]:
    """``(path, action, target)`` of every planned change of one consumer."""
    changes = consumer_doc(doc, name)["changes"]
    return {(p, c["action"], c["target"]) for p, cs in changes.items() for c in cs}


def tree(root: Path, pattern: str = "*") -> dict[Path, bytes]:
    """Every regular file under ``root`` matching ``pattern``, with its content."""
    return {p: p.read_bytes() for p in sorted(root.rglob(pattern)) if p.is_file()} if root.exists() else {}


def tree_changes(before: dict[Path, bytes], after: dict[Path, bytes]) -> set[tuple[str, str]]:
    """``(path, create|update|remove)`` between two :func:`tree` snapshots."""
    out = {(str(p), "create") for p in after.keys() - before.keys()}
    out |= {(str(p), "remove") for p in before.keys() - after.keys()}
    out |= {(str(p), "update") for p in before.keys() & after.keys() if before[p] != after[p]}
    return out
