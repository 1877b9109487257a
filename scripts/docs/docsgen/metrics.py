"""Metric families, read from the ``Family(...)``, ``_gauge(...)`` and ``_counter(...)`` calls that export them.

The collector builds every family at scrape time from calls like ``Family("reloadd_drift", counter,
"Drift events ...", ("consumer", "kind"))``; some are exported only in some states (the event loop
lag while the HTTP listener runs), so the syntax tree, not one scrape, is the complete list. A
name, kind or label given as a local variable is resolved from the function's own assignments.
The ``name`` values of ``reloadd_consumer_stat`` are each plugin's ``stats`` keys.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from . import REPO
from .options import plugins


@dataclass(frozen=True)
class Metric:
    """One exported family."""

    name: str
    """As exported (``reloadd_drift_total`` for the counter ``reloadd_drift``)."""
    kind: str
    labels: tuple[str, ...]
    help: str
    source: str

    @property
    def anchor(self) -> str:
        """The HTML id the reference gives the metric."""
        return f"metric-{self.name}"


def _sources() -> list[Path]:
    files = sorted((REPO / "src" / "reloadd").rglob("*.py"))
    for p in plugins():
        files += sorted(f for f in p.package.rglob("*.py") if "_proto" not in f.parts)
    return files


def _locals(func: ast.AST) -> dict[str, ast.expr]:
    """Simple assignments in a function: ``x = ...`` and ``a, b = 1, 2``."""
    out: dict[str, ast.expr] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                out[target.id] = node.value
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                for t, v in zip(target.elts, node.value.elts, strict=False):
                    if isinstance(t, ast.Name):
                        out[t.id] = v
    return out


def _value(expr: ast.expr | None, names: dict[str, ast.expr]) -> object:
    if isinstance(expr, ast.Name) and expr.id in names:
        return _value(names[expr.id], names)
    if expr is None:
        return None
    try:
        return ast.literal_eval(expr)
    except ValueError:
        return None


def _exported(name: str, kind: str) -> str:
    if kind == "counter":
        return name.removesuffix("_total") + "_total"
    if kind == "info":
        return name + "_info"
    return name


def metrics() -> list[Metric]:
    """Every family any module of the core or a built-in plugin exports."""
    out: dict[str, Metric] = {}
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for func in funcs:
            names = _locals(func)
            for call in ast.walk(func):
                if not isinstance(call, ast.Call):
                    continue
                fname = call.func.id if isinstance(call.func, ast.Name) else (
                    call.func.attr if isinstance(call.func, ast.Attribute) else "")
                if fname not in ("Family", "_gauge", "_counter") or not call.args:
                    continue
                name = _value(call.args[0], names)
                if not isinstance(name, str):
                    continue
                if fname == "Family":
                    kind = _value(call.args[1] if len(call.args) > 1 else None, names)
                    doc = _value(call.args[2] if len(call.args) > 2 else None, names)
                    labels = _value(call.args[3] if len(call.args) > 3 else None, names) or ()
                else:
                    kind = fname.lstrip("_")
                    doc = _value(call.args[1] if len(call.args) > 1 else None, names)
                    labels = ()
                if not isinstance(kind, str):
                    raise ValueError(f"{path.relative_to(REPO)}:{call.lineno}: cannot tell the kind of {name}")
                m = Metric(_exported(name, kind), kind, tuple(labels) if isinstance(labels, (tuple, list)) else (),
                           str(doc or ""), f"{path.relative_to(REPO)}:{call.lineno}")
                out.setdefault(m.name, m)
    return sorted(out.values(), key=lambda m: m.name)


def plugin_stats() -> dict[str, list[str]]:
    """Per plugin, the ``name`` values it exports through ``reloadd_consumer_stat`` (its ``stats`` keys)."""
    out: dict[str, list[str]] = {}
    for p in plugins():
        keys: set[str] = set()
        for f in p.package.rglob("*.py"):
            if "_proto" in f.parts:
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                        and node.value.attr == "stats" and isinstance(node.slice, ast.Constant)
                        and isinstance(node.slice.value, str)):
                    keys.add(node.slice.value)
                if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
                        and any(isinstance(t, ast.Attribute) and t.attr == "stats"
                                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                    keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)
                             and isinstance(k.value, str)}
        out[p.name] = sorted(keys)
    return out
