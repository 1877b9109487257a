"""The picture the code must keep (#22): no import cycle, and the ops services never reach into the pipeline."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "reloadd"
OPS = {"reloadd._http", "reloadd._metrics", "reloadd._control", "reloadd._services", "reloadd._webserver",
       "reloadd._sdnotify"}
PIPELINE = {"reloadd._reloader", "reloadd._engine", "reloadd._queue", "reloadd._aggregator", "reloadd._state",
            "reloadd._observe", "reloadd._changes"}


def parse(f: Path) -> ast.Module:
    """``ast.parse`` with the collector paused: on CPython 3.11 a finalizer that runs during the parse and formats
    a traceback (an asyncio task's "exception was never retrieved" log does) parses again, re-entering the AST
    converter, and the outer parse fails with ``SystemError: AST constructor recursion depth mismatch``."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(f.read_text())
    finally:
        if enabled:
            gc.enable()


def import_graph() -> dict[str, set[str]]:
    """Module → the modules of ``reloadd`` it imports, ``TYPE_CHECKING`` and function-level imports included."""
    mods = {}
    for f in SRC.rglob("*.py"):
        name = ".".join(("reloadd", *f.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
        mods[name] = f
    graph: dict[str, set[str]] = {}
    for name, f in mods.items():
        pkg = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(parse(f)):
            if isinstance(node, ast.ImportFrom):
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
                target = ".".join(p for p in (base, node.module or "") if p)
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        deps.add(f"{target}.{alias.name}")
                    elif target in mods:
                        deps.add(target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_type_checking_imports() -> None:
    graph = import_graph()
    assert "reloadd._services" in graph["reloadd._reloader"]  # imported under TYPE_CHECKING and lazily
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_cycle_in_the_core() -> None:
    assert cycles(import_graph()) == []


def test_ops_services_read_the_snapshot_not_the_pipeline() -> None:
    graph = import_graph()
    for mod in sorted(OPS):
        assert not graph[mod] & PIPELINE, (mod, sorted(graph[mod] & PIPELINE))


def test_the_core_reads_consumers_only_through_the_declared_contract() -> None:
    """Every optional attribute the core reads is declared (``Reporting``, ``PruneAware``, ``SourceProvider``,
    ``Tunable``): no ``getattr`` on a consumer outside ``_building``, where an embedder's table attributes are read."""
    found = []
    for f in SRC.rglob("*.py"):
        if f.name == "_building.py":
            continue
        for node in ast.walk(parse(f)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and node.args and "consumer" in ast.unparse(node.args[0])):
                found.append(f"{f.name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_plan_uses_the_change_decisions_not_the_engine() -> None:
    graph = import_graph()
    assert "reloadd._engine" not in graph["reloadd._plan"]
    for user in ("reloadd._engine", "reloadd._queue", "reloadd._plan", "reloadd._aggregator"):
        assert "reloadd._changes" in graph[user], user
