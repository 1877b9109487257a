"""The longest modules and functions of the core and the plugins, printed by ``make check`` (#63).

It reports and never fails: the aim (modules a newcomer reads without scrolling, ~500 lines; functions under ~80)
is a direction, not a gate, and a number that stays visible on every check is what keeps a file from growing
unnoticed. Generated code (``_proto``) is left out. Run it alone with ``python scripts/size_report.py [--top N]``.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULE_LINES = 500
"""A module longer than this is counted as over (the house style's ~400–500 lines)."""
FUNCTION_LINES = 80
"""A function longer than this is counted as over."""


def sources() -> list[Path]:
    """The core's modules and every plugin's, generated protobuf code left out."""
    roots = [REPO / "src" / "reloadd", *sorted((REPO / "plugins").glob("*/src"))]
    return sorted(f for root in roots for f in root.rglob("*.py") if "_proto" not in f.parts)


def functions(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Every function and method of a module as (qualified name, lines from ``def`` to its last line)."""
    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, (child.end_lineno or child.lineno) - child.lineno + 1
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
    yield from visit(tree, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="how many of each to list (default 10)")
    args = parser.parse_args()
    mods: list[tuple[int, str]] = []
    funcs: list[tuple[int, str]] = []
    for f in sources():
        text = f.read_text()
        rel = f.relative_to(REPO).as_posix()
        mods.append((len(text.splitlines()), rel))
        funcs.extend((n, f"{rel}:{name}") for name, n in functions(ast.parse(text, filename=rel)))
    mods.sort(reverse=True)
    funcs.sort(reverse=True)
    over_m = sum(1 for n, _ in mods if n > MODULE_LINES)
    over_f = sum(1 for n, _ in funcs if n > FUNCTION_LINES)
    print(f"size report (reports, never fails): {len(mods)} modules, {over_m} over {MODULE_LINES} lines; "
          f"{len(funcs)} functions, {over_f} over {FUNCTION_LINES} lines")
    print("  longest modules (lines):")
    for n, where in mods[: args.top]:
        print(f"  {n:6d}  {where}")
    print("  longest functions (lines):")
    for n, where in funcs[: args.top]:
        print(f"  {n:6d}  {where}")


if __name__ == "__main__":
    main()
