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
    where typer prints the Python type ``<list[str]>`` (issue 41); and every positional
    argument its name in capitals, as ``gh`` and ``kubectl`` write them (``JOB``,
    ``{JOBS}...``), where typer prints ``{job}`` in the usage line and the list's
    ``<list[str]>`` beside it."""
    help_option = command.get_help_option(typer.Context(command))
    for param in [*command.params, help_option]:
        if param is None or param.metavar is not None:
            continue
        if getattr(param, "param_type_name", "") == "argument":
            _name_argument(param)
        elif getattr(param, "is_flag", False):
            param.metavar = ""
        elif getattr(param, "multiple", False):
            param.metavar = f"{(param.name or 'value').upper()}..."


def _name_argument(param: Any) -> None:
    """``JOB <str>`` for one value, ``JOBS <str>`` for several (the usage line's dots,
    ``{JOBS}...``, say the repetition; typer braces a required argument there)."""
    many = param.nargs != 1
    param.metavar = (param.name or "value").upper()
    if many:
        shown = param.display_type

        def element_type(ctx: Any) -> str:
            label: str = shown(ctx)
            if label.startswith("<list[") and label.endswith("]>"):
                return "<" + label[len("<list[") : -len("]>")] + ">"
            return label

        param.display_type = element_type


def untyped_flags(root: Any) -> None:
    """Give every flag of ``root`` and its subcommands (``--help`` too) no type label."""
    for command in _commands(root):
        tidy_flags(command)


class FlagsGroup(TyperGroup):
    """The app's top group: its tree's flags are tidied before each run."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        untyped_flags(self)
        return super().main(*args, **kwargs)
