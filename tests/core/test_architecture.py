"""The picture the code must keep (#22, #63): the core's layers are its packages, imports point down only, no
import cycle, and the ops services never reach into the pipeline.

The layers, top to bottom, as docs/architecture.md draws them (a module may import its own layer and the layers
listed as below it here, nothing above):

* **cli**: ``reloadd.cli``, ``reloadd.__main__``, ``reloadd._logging``
* **facade**: ``reloadd`` (its ``__init__``), ``reloadd._reloader``, ``reloadd._wiring``, ``reloadd._observe``
* **ops**: ``reloadd._ops.*``: reads the contract (the ``Snapshot``) only
* **pipeline**: ``reloadd._pipeline.*``: over state and the contract
* **state**: ``reloadd._state.*``: over the contract
* **sources**: ``reloadd._sources.*``: emit events, import the contract only
* **contract**: the other top-level modules of ``reloadd`` (what a plugin author reads first): import each other only
"""

from __future__ import annotations

import ast
import gc
import re
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "reloadd"
DOC = Path(__file__).parents[2] / "docs" / "architecture.md"
CLI = {"reloadd.cli", "reloadd.__main__", "reloadd._logging"}
FACADE = {"reloadd", "reloadd._reloader", "reloadd._wiring", "reloadd._observe"}
CONTRACT = {"reloadd._backoff", "reloadd._command", "reloadd._config", "reloadd._consumer", "reloadd._errors",
            "reloadd._filters", "reloadd._health", "reloadd._options", "reloadd._order", "reloadd._outcomes",
            "reloadd._provides", "reloadd._snapshot", "reloadd._source", "reloadd._suggest", "reloadd._types",
            "reloadd._watch"}
MAY_IMPORT = {
    "cli": {"cli", "facade", "ops", "pipeline", "state", "sources", "contract"},
    "facade": {"facade", "ops", "pipeline", "state", "sources", "contract"},
    "ops": {"ops", "contract"},
    "pipeline": {"pipeline", "state", "contract"},
    "state": {"state", "contract"},
    "sources": {"sources", "contract"},
    "contract": {"contract"},
}
"""Which layers each layer may import: the arrows of docs/architecture.md's picture, all pointing down."""
OPS_MAY_NOT = {"reloadd._reloader", "reloadd._observe"}


def layer(mod: str) -> str:
    """The layer a core module belongs to: its package, or for a top-level module the set naming it."""
    for pkg in ("ops", "pipeline", "state", "sources"):
        if mod == f"reloadd._{pkg}" or mod.startswith(f"reloadd._{pkg}."):
            return pkg
    for name, members in (("cli", CLI), ("facade", FACADE), ("contract", CONTRACT)):
        if mod in members:
            return name
    raise AssertionError(f"{mod} is in no layer: put it in a layer's package, or name it in CLI, FACADE or CONTRACT")


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
    assert "reloadd._ops._services" in graph["reloadd._reloader"]  # imported under TYPE_CHECKING and lazily
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_cycle_in_the_core() -> None:
    assert cycles(import_graph()) == []


def against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points up (or sideways into a layer it may not read): ``importer -> imported``."""
    return [f"{mod} ({layer(mod)}) -> {dep} ({layer(dep)})"
            for mod in sorted(graph) for dep in sorted(graph[mod]) if layer(dep) not in MAY_IMPORT[layer(mod)]]


def test_every_core_module_is_in_one_layer() -> None:
    for mod in import_graph():
        layer(mod)


def test_imports_point_down_the_layers() -> None:
    assert against_the_layers(import_graph()) == []


def test_the_layer_check_sees_an_import_against_the_layers() -> None:
    graph = {"reloadd._ops._http": {"reloadd._pipeline._engine", "reloadd._snapshot"},
             "reloadd._sources.inotify": {"reloadd._filters"}, "reloadd._types": {"reloadd._state._records"}}
    assert against_the_layers(graph) == ["reloadd._ops._http (ops) -> reloadd._pipeline._engine (pipeline)",
                                         "reloadd._types (contract) -> reloadd._state._records (state)"]


def test_ops_services_read_the_snapshot_not_the_pipeline() -> None:
    graph = import_graph()
    for mod in sorted(m for m in graph if layer(m) == "ops"):
        assert not graph[mod] & OPS_MAY_NOT, (mod, sorted(graph[mod] & OPS_MAY_NOT))


def picture_rows() -> dict[str, str]:
    """docs/architecture.md's picture (its first code block) as layer → the text of that layer's lines: a line that
    begins (after the arrows) with a layer's name starts it, the lines under it until the next layer continue it."""
    picture = DOC.read_text().split("```", 2)[1]
    rows: dict[str, str] = {}
    current = ""
    for line in picture.splitlines():
        m = re.match(r"[\s│╲└─]*(CLI|Facade|Ops|Pipeline|State|Sources|Contract)\b", line)
        if m:
            current = m.group(1).lower()
        if current:
            rows[current] = rows.get(current, "") + " " + line
    return rows


def test_the_doc_picture_names_every_module_under_its_layer() -> None:
    """The picture and the package tree agree line for line: every module of the core is named, by its path under
    ``src/reloadd/``, on the lines of its own layer and no other's."""
    rows = picture_rows()
    assert set(rows) == set(MAY_IMPORT), sorted(rows)
    for f in sorted(SRC.rglob("*.py")):
        rel = f.relative_to(SRC)
        if rel.name in ("__init__.py", "__main__.py"):
            continue
        mod = ".".join(("reloadd", *rel.with_suffix("").parts))
        shown = rel.as_posix()
        where = sorted(name for name, text in rows.items() if re.search(rf"(?<![\w/]){re.escape(shown)}", text))
        assert where == [layer(mod)], (shown, layer(mod), where)



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
    for part in ("_engine", "_intake", "_rescans", "_settle"):  # the engine and its parts
        assert f"reloadd._pipeline.{part}" not in graph["reloadd._pipeline._plan"], part
    for user in ("reloadd._pipeline._rescans", "reloadd._pipeline._settle", "reloadd._pipeline._queue",
                 "reloadd._pipeline._plan", "reloadd._pipeline._aggregator"):
        assert "reloadd._pipeline._changes" in graph[user], user
