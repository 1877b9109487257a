"""The reference pages, as markdown text, from what the extractors found."""

from __future__ import annotations

import re

from . import REGENERATE
from .cli import commands
from .metrics import metrics, plugin_stats
from .options import Key, core_keys, plugin_keys, plugins

HEADER = f"<!-- Generated from the code by `{REGENERATE}`; do not edit: edit the docstrings it reads. -->\n\n"


def _md(text: str) -> str:
    """reST-flavoured docstring text as one markdown table cell."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return re.sub(r"\s+", " ", text).replace("|", "\\|").strip()


def _key_table(keys: list[Key], prefix: str = "") -> list[str]:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in keys:
        meaning = _md(k.meaning) or "*(no docstring: add one where the key is read)*"
        rows.append(f'| <a id="{k.anchor}"></a>`{prefix}{k.name}` | {k.type} | {k.default} | {meaning} |')
    return rows


def configuration() -> str:
    """``docs/reference/configuration.md``: ``[reloadd]`` and ``[[consumer]]``."""
    keys = core_keys()
    lines = [HEADER + "# Configuration file", "",
             "One TOML file (`reloadd check --config FILE` validates it). Durations are strings such as "
             '`"200ms"`, `"15s"`, `"1.5m"`, `"2h"` (at most 30 days); relative paths resolve against the '
             "file's folder. Unknown keys and wrong types are errors that name the file, the key and the "
             "expected type.", "",
             "## `[reloadd]`", "", "Settings of the whole daemon.", "",
             *_key_table([k for k in keys if k.table == "reloadd"]), "",
             "## `[[consumer]]`", "",
             "One table per consumer; `quiet`, `max_delay` and `max_hold` default to the `[reloadd]` values. "
             "Each plugin's `[consumer.options]` are listed in [Plugin options](plugins.md).", "",
             *_key_table([k for k in keys if k.table == "consumer"]), ""]
    return "\n".join(lines)


def plugin_options() -> str:
    """``docs/reference/plugins.md``: every plugin's ``[consumer.options]``."""
    lines = [HEADER + "# Plugin options", "",
             "The keys of `[consumer.options]` for each built-in plugin (`plugin = \"...\"` in a "
             "`[[consumer]]` table). A dotted key is a sub-table: `notify.url` is `url` in "
             "`[consumer.options.notify]`.", ""]
    for p in plugins():
        lines += [f"## `{p.name}`", "", *_key_table(plugin_keys(p)), ""]
    return "\n".join(lines)


def metrics_page() -> str:
    """``docs/reference/metrics.md``: every exported family."""
    lines = [HEADER + "# Metrics", "",
             "Served at `/metrics` when `[reloadd] metrics_listen` is set (Prometheus text 0.0.4, or "
             "OpenMetrics when asked). Alert rules: `examples/prometheus/reloadd-alerts.yaml`.", "",
             "| metric | type | labels | meaning |", "|---|---|---|---|"]
    for m in metrics():
        labels = ", ".join(f"`{lab}`" for lab in m.labels)
        lines.append(f'| <a id="{m.anchor}"></a>`{m.name}` | {m.kind} | {labels} | {_md(m.help)} |')
    lines += ["", "## `reloadd_consumer_stat` names per plugin", "",
              "Each plugin's own numbers (its `stats`), exported as "
              '`reloadd_consumer_stat{consumer="...",name="..."}`.', "",
              "| plugin | `name` values |", "|---|---|"]
    for plugin, names in plugin_stats().items():
        lines.append(f"| `{plugin}` | {', '.join(f'`{n}`' for n in names) or '—'} |")
    return "\n".join(lines) + "\n"


def cli_page() -> str:
    """``docs/reference/cli.md``: commands and flags from the parser."""
    cmds, flags, description = commands()
    lines = [HEADER + "# Command line", "", _md(description), "",
             "## Global flags", "", "| flag | default | choices | meaning |", "|---|---|---|---|"]

    def row(f: object) -> str:
        from .cli import Flag

        assert isinstance(f, Flag)
        names = ", ".join(f"`{n}`" for n in f.flags)
        choices = ", ".join(f"`{c}`" for c in f.choices)
        req = " (required)" if f.required else ""
        return f'| <a id="{f.anchor}"></a>{names}{req} | {f.default} | {choices} | {_md(f.help)} |'

    lines += [row(f) for f in flags if not f.command]
    for c in cmds:
        lines += ["", f'## <a id="{c.anchor}"></a>`reloadd {c.name}`', "", _md(c.help) + ".", "",
                  "| flag | default | choices | meaning |", "|---|---|---|---|"]
        lines += [row(f) for f in flags if f.command == c.name]
    return "\n".join(lines) + "\n"


def api_page() -> str:
    """``docs/reference/api.md``: mkdocstrings renders the public names from their docstrings."""
    return (HEADER + "# Python API\n\n"
            "The public names of `reloadd` (its `__all__`), for embedding and for writing plugins; "
            "rendered from their docstrings.\n\n"
            "::: reloadd\n    options:\n      show_root_heading: false\n      show_source: false\n"
            "      members_order: alphabetical\n      heading_level: 2\n")


PAGES = {
    "configuration.md": configuration,
    "plugins.md": plugin_options,
    "metrics.md": metrics_page,
    "cli.md": cli_page,
    "api.md": api_page,
}
"""Every generated page of ``docs/reference/``, by file name."""
