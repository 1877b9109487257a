"""Commands and flags, read from the ``reloadd`` argparse parser itself."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """One option of the top-level parser (``command == ""``) or of a command."""

    command: str
    flags: tuple[str, ...]
    help: str
    default: str
    choices: tuple[str, ...]
    required: bool

    @property
    def anchor(self) -> str:
        """The HTML id the reference gives the flag."""
        return f"cli-{self.command or 'reloadd'}-{self.flags[0].lstrip('-')}"


@dataclass(frozen=True)
class Command:
    """One sub-command."""

    name: str
    help: str

    @property
    def anchor(self) -> str:
        """The HTML id the reference gives the command."""
        return f"cli-{self.name}"


def _parser() -> argparse.ArgumentParser:
    from reloadd import cli

    return cli._parser()


def _flags(parser: argparse.ArgumentParser, command: str) -> list[Flag]:
    out = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or isinstance(
            action, argparse._VersionAction) else f"`{default}`"
        flags = tuple(sorted(action.option_strings, key=lambda f: (not f.startswith("--"), f)))
        out.append(Flag(command, flags, action.help or "", shown, tuple(action.choices or ()),
                        bool(action.required)))
    return out


def commands() -> tuple[list[Command], list[Flag], str]:
    """The sub-commands, every flag (global and per command), and the parser's description."""
    parser = _parser()
    cmds: list[Command] = []
    flags = _flags(parser, "")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                cmds.append(Command(name, helps.get(name, "")))
                flags += _flags(sub, name)
    return cmds, flags, parser.description or ""
