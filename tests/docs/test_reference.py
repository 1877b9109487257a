"""docs/reference/ is generated from the code: every key, metric and flag in one is in the other."""

from __future__ import annotations

import re

from ._docsgen import DOCS, docsgen


def _in_code() -> dict[str, str]:
    """Anchor → what it is and where the code defines it."""
    options, metrics, cli = docsgen("options"), docsgen("metrics"), docsgen("cli")
    found: dict[str, str] = {}
    for k in options.core_keys():
        found[k.anchor] = f"[{k.table}] key {k.name!r} ({k.source})"
    for p in options.plugins():
        for k in options.plugin_keys(p):
            found[k.anchor] = f"plugin {p.name} option {k.name!r} ({k.source})"
    for m in metrics.metrics():
        found[m.anchor] = f"metric {m.name} ({m.source})"
    cmds, flags, _ = cli.commands()
    for c in cmds:
        found[c.anchor] = f"command `reloadd {c.name}` (src/reloadd/cli.py)"
    for f in flags:
        found[f.anchor] = f"flag {f.flags[0]} of `reloadd {f.command}` (src/reloadd/cli.py)".replace(
            "`reloadd `", "`reloadd`")
    return found


def _in_docs() -> dict[str, str]:
    found = {}
    for page in sorted((DOCS / "reference").glob("*.md")):
        for anchor in re.findall(r'<a id="([^"]+)"></a>', page.read_text()):
            found[anchor] = f"docs/reference/{page.name}"
    return found


def test_reference_lists_every_key_metric_and_flag_of_the_code() -> None:
    code, docs = _in_code(), _in_docs()
    assert len(code) > 100  # the extractors found the tables, not nothing
    missing = [code[a] for a in sorted(set(code) - set(docs))]
    stale = [f"{a} (in {docs[a]})" for a in sorted(set(docs) - set(code))]
    regen = docsgen().REGENERATE
    assert not missing and not stale, (
        "docs/reference/ and the code differ; run `" + regen + "` and commit docs/reference/.\n"
        + "".join(f"  in the code, not in the reference: {m}\n" for m in missing)
        + "".join(f"  in the reference, not in the code: {s}\n" for s in stale))


def test_reference_pages_are_what_the_generator_writes_now() -> None:
    """Types, defaults and meanings too: a changed default or docstring shows up as a stale page."""
    render = docsgen("render")
    stale = [name for name, page in render.PAGES.items()
             if not (DOCS / "reference" / name).exists() or (DOCS / "reference" / name).read_text() != page()]
    assert not stale, f"docs/reference/ out of date: {', '.join(stale)}; run `{docsgen().REGENERATE}`"


def test_every_option_has_a_meaning_in_a_docstring() -> None:
    options = docsgen("options")
    keys = options.core_keys() + [k for p in options.plugins() for k in options.plugin_keys(p)]
    bare = [f"{k.table} {k.name} ({k.source})" for k in keys if not k.meaning]
    assert not bare, "options without a docstring entry (Attributes:/Options: section): " + ", ".join(bare)
