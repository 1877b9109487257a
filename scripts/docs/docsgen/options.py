"""Configuration keys and plugin options, read from the ``Options`` calls that parse them.

Every option reloadd accepts is read through :class:`reloadd.Options` (``opts.duration("quiet",
0.05)``): unknown keys are errors, so a key that no call reads cannot be set, and a call is the
one definition of a key, its type and its default. This module walks the syntax tree of the
parsing modules, finds each ``Options(...)`` object and every method called on it, and places
it in its table:

* in ``src/reloadd/_config.py``: the object built from ``top.table("reloadd")`` reads
  ``[reloadd]``; the one of ``_consumer`` (and the helpers it is passed to) reads ``[[consumer]]``;
* in a plugin: an object built from ``ctx.options`` reads ``[consumer.options]``; one built from
  a parameter reads the sub-table its callers pass (``Notifier.from_options(opts.table("notify"))``
  reads ``notify.*``).

Defaults are evaluated in the module's namespace (``DEFAULT_ADDRESS``, ``5 * 1024 * 1024``).
Meanings come from the docstrings: the ``Options:`` section of the function that reads the key,
else the ``Attributes:`` section of a class in the module or package with an attribute of the
same name. A site this module cannot place is an error, not a silent omission.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import REPO

CORE_CONFIG = REPO / "src" / "reloadd" / "_config.py"
_METHODS = {"str", "bool", "int", "number", "duration", "path", "str_list", "table", "choice", "_get", "has"}
_KIND_NAMES = {"str": "string", "list": "list", "dict": "table", "int": "integer", "float": "number",
               "bool": "boolean"}


@dataclass(frozen=True)
class Key:
    """One option: where it lives, its type, default and meaning."""

    table: str
    """``reloadd``, ``consumer`` or ``<plugin>`` (the plugin's ``[consumer.options]``)."""
    name: str
    """Dotted within its table (``notify.url``)."""
    type: str
    default: str
    meaning: str
    source: str
    """``path:line`` of the call that reads it."""

    @property
    def anchor(self) -> str:
        """The HTML id the reference gives the key (what the drift test looks for)."""
        return f"{self.table}.{self.name}".replace(".", "-")


@dataclass
class _Site:
    func: ast.FunctionDef | ast.AsyncFunctionDef
    var: str
    scope: str | None  # dotted prefix, "" for the table's root; None: not placed yet
    origin: ast.expr | None  # what Options() was built from (None: a parameter annotated Options)


def _functions(tree: ast.Module) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.ClassDef | None]]:
    out: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.ClassDef | None]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node, None))
        elif isinstance(node, ast.ClassDef):
            out += [(n, node) for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return out


def _sites(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[_Site]:
    """The ``Options`` objects a function builds or is given."""
    sites = []
    placed: set[int] = set()
    for node in ast.walk(func):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "Options" and node.value.args):
            sites.append(_Site(func, node.targets[0].id, None, node.value.args[0]))
            placed.add(id(node.value))
    for node in ast.walk(func):  # Options(...) kept elsewhere (an attribute, an argument) would be missed
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Options"
                and id(node) not in placed):
            raise ValueError(f"line {node.lineno}: Options(...) in {func.name}() must be assigned to a local "
                             "name for docsgen to list its keys (opts = Options(...))")
    for arg in func.args.args:
        if (isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Options") or (
                isinstance(arg.annotation, ast.Constant) and arg.annotation.value == "Options"):
            sites.append(_Site(func, arg.arg, None, None))
    return sites


def _through_helpers(site: _Site) -> list[ast.Call]:
    """``p("pid_file")`` where a nested ``def p(key, default=None)`` returns ``g.path(key, default, ...)``.

    Each such call is rewritten as the ``g.path("pid_file", ...)`` call it amounts to.
    """
    out: list[ast.Call] = []
    for helper in ast.walk(site.func):
        if helper is site.func or not isinstance(helper, ast.FunctionDef):
            continue
        params = [a.arg for a in helper.args.args]
        inner = next((n for n in ast.walk(helper) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and isinstance(n.func.value, ast.Name) and n.func.value.id == site.var
                      and n.func.attr in _METHODS and n.args and isinstance(n.args[0], ast.Name)
                      and n.args[0].id in params), None)
        if inner is None:
            continue
        for call in ast.walk(site.func):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == helper.name
                    and call.args and isinstance(call.args[0], ast.Constant)):
                args = [call.args[params.index(a.id)] if isinstance(a, ast.Name) and a.id in params
                        and params.index(a.id) < len(call.args) else a for a in inner.args]
                if len(args) > 1 and isinstance(inner.args[1], ast.Name) and inner.args[1].id in params \
                        and params.index(inner.args[1].id) >= len(call.args):
                    args[1] = ast.Constant(None)
                new = ast.Call(func=inner.func, args=args, keywords=inner.keywords)
                ast.fix_missing_locations(ast.copy_location(new, call))
                out.append(new)
    return out


def _first(call: ast.Call) -> str:
    arg = call.args[0]
    return str(arg.value) if isinstance(arg, ast.Constant) else ""


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in func.args.args]
    return names[1:] if names and names[0] in ("self", "cls") else names


def _table_of(expr: ast.expr) -> tuple[str, str] | None:
    """``X.table("k")`` → ``("X", "k")``."""
    if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "table"
            and isinstance(expr.func.value, ast.Name) and expr.args and isinstance(expr.args[0], ast.Constant)):
        return expr.func.value.id, str(expr.args[0].value)
    return None


def _is_ctx_options(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Attribute) and expr.attr == "options"


def _place(sites: list[_Site], calls: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.Call]]) -> None:
    """Give every site its dotted scope from how its table reaches it (fixed point over call sites)."""
    by_func: dict[int, list[_Site]] = {}
    for s in sites:
        by_func.setdefault(id(s.func), []).append(s)

    def scope_of_var(func: ast.FunctionDef | ast.AsyncFunctionDef, var: str) -> str | None:
        for s in by_func.get(id(func), []):
            if s.var == var:
                return s.scope
        return None

    for _ in range(len(sites) + 1):
        for s in sites:
            if s.scope is not None:
                continue
            if s.origin is not None and _is_ctx_options(s.origin):
                s.scope = ""
                continue
            if s.origin is not None and _table_of(s.origin):
                parent, key = _table_of(s.origin)  # type: ignore[misc]
                outer = scope_of_var(s.func, parent)
                if outer is not None:
                    s.scope = f"{outer}{key}."
                continue
            param = s.var if s.origin is None else (s.origin.id if isinstance(s.origin, ast.Name) else None)
            if param is None or param not in _params(s.func):
                continue
            index = _params(s.func).index(param)
            for caller, call in calls:
                name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
                if name != s.func.name:
                    continue
                passed = next((k.value for k in call.keywords if k.arg == param), None)
                if passed is None and index < len(call.args):
                    passed = call.args[index]
                if passed is None:
                    continue
                if _is_ctx_options(passed):
                    s.scope = ""
                elif _table_of(passed):
                    parent, key = _table_of(passed)  # type: ignore[misc]
                    outer = scope_of_var(caller, parent)
                    if outer is not None:
                        s.scope = f"{outer}{key}."
                elif isinstance(passed, ast.Name):
                    s.scope = scope_of_var(caller, passed.id)


def _docsections(doc: str | None, title: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style docstring section (continuation lines joined)."""
    if not doc:
        return {}
    out: dict[str, str] = {}
    lines = doc.expandtabs().splitlines()
    inside, indent, current = False, 0, None
    for line in lines:
        stripped = line.strip()
        if not inside:
            if re.match(rf"^{title}(\s*\(.*\))?:$", stripped):
                inside, indent = True, len(line) - len(line.lstrip())
            continue
        if not stripped:
            current = None
            continue
        here = len(line) - len(line.lstrip())
        if here <= indent:
            break
        m = re.match(r"^([A-Za-z_][\w.]*)\s*(?:\([^)]*\))?:\s*(.*)$", stripped)
        if m and (current is None or here <= current[1]):
            current = (m.group(1), here)
            out[m.group(1)] = m.group(2)
        elif current is not None:
            out[current[0]] = f"{out[current[0]]} {stripped}".strip()
    return out


def _attributes(tree: ast.Module, only: str | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and only in (None, node.name):
            for k, v in _docsections(ast.get_docstring(node), "Attributes").items():
                out.setdefault(k, v)
    return out


def _fmt_seconds(seconds: float) -> str:
    if seconds == 0:
        return '"0s"'
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f'"{seconds / size:g}{unit}"'
    return f'"{seconds * 1000:g}ms"'


def _fmt(value: Any, method: str) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if method == "duration" and isinstance(value, (int, float)):
        return f"`{_fmt_seconds(float(value))}`"
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`" if value else "`[]`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def _evaluate(expr: ast.expr, namespace: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, eval(compile(ast.Expression(expr), "<default>", "eval"), dict(namespace))
    except Exception:
        return False, None


def _arg(call: ast.Call, index: int, name: str) -> ast.expr | None:
    kw = next((k.value for k in call.keywords if k.arg == name), None)
    if kw is not None:
        return kw
    return call.args[index] if index < len(call.args) else None


def _describe(call: ast.Call, method: str, ns: dict[str, Any]) -> tuple[str, str]:
    """Type and default of one ``opts.<method>(key, ...)`` call."""
    default_expr = _arg(call, 1, "default")
    kind = {"str": "string", "bool": "boolean", "int": "integer", "number": "number", "duration": "duration",
            "path": "path", "str_list": "list of strings", "table": "table", "has": "any"}.get(method, method)
    default: Any = None
    if method == "bool" and default_expr is None:
        default = False
    elif method == "str_list" and default_expr is None:
        default = []
    elif method == "table":
        default = {}
    if method == "choice":
        ok, choices = _evaluate(call.args[1], ns) if len(call.args) > 1 else (False, None)
        kind = "one of " + ", ".join(f'`"{c}"`' for c in choices or ()) if ok else "a choice"
        default_expr = _arg(call, 2, "default")
    if method == "_get":
        ok, kinds = _evaluate(call.args[1], ns) if len(call.args) > 1 else (False, None)
        kind = " or ".join(_KIND_NAMES.get(k.__name__, k.__name__) for k in kinds or ()) if ok else "any"
        default_expr = _arg(call, 2, "default")
    if default_expr is not None:
        ok, value = _evaluate(default_expr, ns)
        default = value if ok else None
        shown = _fmt(value, method) if ok else f"(`{ast.unparse(default_expr)}`, see meaning)"
    else:
        shown = _fmt(default, method)
    bounds = []
    for bound, sign in (("minimum", "≥"), ("maximum", "≤")):
        expr = _arg(call, 99, bound)
        if expr is not None:
            ok, value = _evaluate(expr, ns)
            if ok and value is not None:
                limit = (_fmt_seconds(float(value)).strip('"') if method == "duration"
                         else f"{value:,}".replace(",", "_"))
                if not (method == "duration" and bound == "minimum" and value == 0):
                    bounds.append(f"{sign} {limit}")
    if bounds:
        kind = f"{kind} ({', '.join(bounds)})"
    required = _arg(call, 99, "required")
    if isinstance(required, ast.Constant) and required.value is True:
        shown = "(required)"
    return kind, shown


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    i = parts.index("src")
    return ".".join(parts[i + 1:])


def _keys_of(paths: list[Path], table_of_scope: dict[str, str] | None, plugin: str | None,
             package_attrs: dict[str, str], callers: list[Path] | None = None) -> list[Key]:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in [*paths, *(callers or [])]}
    sites: list[_Site] = []
    calls: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.Call]] = []
    owner: dict[int, Path] = {}
    for p, tree in trees.items():
        for func, _cls in _functions(tree):
            if p in paths:
                sites += _sites(func)
            owner[id(func)] = p
            calls += [(func, n) for n in ast.walk(func) if isinstance(n, ast.Call)]
    if table_of_scope is not None:  # the core file: its tables are named by the functions that read them
        for s in sites:
            if s.func.name in table_of_scope:
                s.scope = ""
    else:
        _place(sites, calls)
    keys: list[Key] = []
    for s in sites:
        path = owner[id(s.func)]
        rel = path.relative_to(REPO)
        used = [n for n in ast.walk(s.func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Name) and n.func.value.id == s.var and n.func.attr in _METHODS
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)]
        used += _through_helpers(s)
        if table_of_scope is not None:
            if s.func.name not in table_of_scope:
                if used:
                    raise ValueError(f"{rel}:{s.func.lineno}: cannot tell which table {s.func.name}() reads; "
                                     "name it in docsgen.options.CORE_TABLES")
                continue
            table, scope = table_of_scope[s.func.name], ""
        else:
            assert plugin is not None
            if s.scope is None:
                if used:
                    raise ValueError(f"{rel}:{s.func.lineno}: cannot tell which table the Options of "
                                     f"{s.func.name}() reads")
                continue
            table, scope = plugin, s.scope
        ns = vars(importlib.import_module(_module_name(path)))
        own = {**_docsections(ast.get_docstring(trees[path]), "Options"),
               **_docsections(ast.get_docstring(s.func), "Options")}
        attrs = {**package_attrs, **_attributes(trees[path])}
        if table_of_scope is not None:
            attrs = _attributes(trees[path], CORE_CLASSES[table])
        for call in used:
            assert isinstance(call.func, ast.Attribute)
            method, key = call.func.attr, _first(call)
            if method == "has" and any(
                    isinstance(o.func, ast.Attribute) and o.func.attr != "has" and _first(o) == key for o in used):
                continue  # has() only asks; the typed read below defines the key
            if method == "table" and any(t.scope == f"{scope}{key}." for t in sites):
                continue  # a sub-table whose keys are listed one by one
            kind, default = _describe(call, method, ns)
            meaning = own.get(key) or own.get(f"{scope}{key}") or attrs.get(key, "")
            keys.append(Key(table, f"{scope}{key}", kind, default, meaning, f"{rel}:{call.lineno}"))
    keys.sort(key=lambda k: (k.source.split(":")[0], int(k.source.split(":")[1])))  # as the code reads them
    seen: dict[tuple[str, str], Key] = {}
    for k in keys:  # a key read twice (``state_dir``: "" first, then as a path): the typed read wins
        if (k.table, k.name) not in seen or seen[k.table, k.name].type == "string":
            seen[k.table, k.name] = k
    return list(seen.values())


CORE_TABLES = {"parse_config": "reloadd", "_consumer": "consumer", "_groups": "consumer"}
"""Which table each reading function of ``_config.py`` reads (``top`` in ``parse_config`` is skipped)."""
CORE_CLASSES = {"reloadd": "Config", "consumer": "ConsumerConfig"}
"""The class whose ``Attributes:`` section gives each core table's meanings."""


def core_keys() -> list[Key]:
    """Every ``[reloadd]`` and ``[[consumer]]`` key."""
    keys = _keys_of([CORE_CONFIG], CORE_TABLES, None, {})
    # parse_config also reads the file's top level (`reloadd`, `consumer`) through `top`: not keys of a table.
    return [k for k in keys if not (k.table == "reloadd" and k.name in ("reloadd", "consumer"))]


@dataclass(frozen=True)
class Plugin:
    """A built-in plugin: its entry-point name, its folder and its package."""

    name: str
    folder: Path
    package: Path


def plugins() -> list[Plugin]:
    """The plugins under ``plugins/``, named by their ``reloadd.consumers`` entry point."""
    import tomllib

    out = []
    for pyproject in sorted((REPO / "plugins").glob("*/pyproject.toml")):
        doc = tomllib.loads(pyproject.read_text())
        for name, target in doc.get("project", {}).get("entry-points", {}).get("reloadd.consumers", {}).items():
            package = pyproject.parent / "src" / target.split(":")[0].split(".")[0]
            out.append(Plugin(name, pyproject.parent, package))
    return sorted(out, key=lambda p: p.name)


def plugin_keys(plugin: Plugin) -> list[Key]:
    """Every option of one plugin's ``[consumer.options]``."""
    files = sorted(p for p in plugin.package.rglob("*.py") if "_proto" not in p.parts)
    reading = [p for p in files if "Options(" in p.read_text() or ": Options" in p.read_text()]
    attrs: dict[str, str] = {}
    for p in reading:
        for k, v in _attributes(ast.parse(p.read_text())).items():
            attrs.setdefault(k, v)
    return _keys_of(reading, None, plugin.name, attrs, [p for p in files if p not in reading])
