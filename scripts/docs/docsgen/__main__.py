"""``python -m docsgen [--check]`` (from scripts/docs): write docs/reference/, or say what differs."""

from __future__ import annotations

import argparse
import sys

from . import REFERENCE, REGENERATE
from .render import PAGES


def main(argv: list[str] | None = None) -> int:
    """Write every reference page (``--check``: write nothing, exit 1 if any page is out of date)."""
    ap = argparse.ArgumentParser(prog="docsgen", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs from the code")
    args = ap.parse_args(argv)
    REFERENCE.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, render in PAGES.items():
        text = render()
        path = REFERENCE / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"docs/reference out of date: {', '.join(stale)}; run `{REGENERATE}`", file=sys.stderr)
        return 1
    print(f"docs/reference: {len(stale)} page(s) {'stale' if args.check else 'written'}, "
          f"{len(PAGES) - len(stale)} unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
