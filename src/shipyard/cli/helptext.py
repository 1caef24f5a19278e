"""``--help`` without a type after each flag: ``--quiet -q``, not ``--quiet -q <bool>``.

Why: typer (0.29) prints every option's type in its help panels, flags included, where
``<bool>`` reads as a value to pass (``--quiet true``), which a flag does not take.
A flag's empty ``metavar`` is the documented way to print no type; it is set here once
on the whole command tree (help options included) before the command line is parsed,
so every command's flags, present and future, read as flags.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer.core import TyperGroup


def _commands(command: Any) -> Iterator[Any]:
    yield command
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from _commands(sub)


def tidy_flags(command: Any) -> None:
    """Give every flag of ``command`` itself (``--help`` too) no type label, and every
    repeatable option without a metavar of its own its name, repeatable (``TAG...``),
    where typer prints the Python type ``<list[str]>`` (issue 41)."""
    help_option = command.get_help_option(typer.Context(command))
    for param in [*command.params, help_option]:
        if param is None or param.metavar is not None:
            continue
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif getattr(param, "multiple", False):
            param.metavar = f"{(param.name or 'value').upper()}..."


def untyped_flags(root: Any) -> None:
    """Give every flag of ``root`` and its subcommands (``--help`` too) no type label."""
    for command in _commands(root):
        tidy_flags(command)


class FlagsGroup(TyperGroup):
    """The app's top group: its tree's flags are tidied before each run."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        untyped_flags(self)
        return super().main(*args, **kwargs)
