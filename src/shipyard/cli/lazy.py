"""Commands that load on first use, and parameters read without pydantic.

Why (issue 40): the ``shipyard`` group used to import every command's module to start, so
``shipyard --help`` or ``jobs`` paid for the model server, staging and pydantic (0.4-0.5 s
of CPU before any work). Here the top group knows each command by name, its module and
the help line ``--help`` lists; a command's module is imported, and its click command
built by typer, only when that command runs (or a test walks the tree). ``--help`` and
the shell's completion of command names list the names from the table, never loading one.

typer (0.29) coerces every parameter's value with a pydantic TypeAdapter, 0.05-0.1 s to
import and build: the plain cases (a ``str``, an ``int`` or ``float`` written plainly, a
list of ``str``) are read here as pydantic reads them, and anything else (a value in
another form, a bad value whose message the user must see as before) still goes through
typer's own coercion. Where typer's internals differ (another typer), nothing here
applies and typer does it all, as before.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand

from shipyard.cli.helptext import FlagsGroup, tidy_flags

try:  # typer's coercion seam (0.29); absent elsewhere: typer coerces everything then
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # pragma: no cover - another typer
    RuntimeParam = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class Entry:
    """A command the top group lists: the module whose ``register(app)`` defines it, and
    its help as the command's docstring gives it (tests/unit/cli checks they agree)."""

    module: str
    help: str


class LazyCommands(MutableMapping[str, Any]):
    """The group's commands by name, in the table's order; a command is built on first
    lookup (``commands[name]``), with every other command of its module."""

    def __init__(self, entries: dict[str, Entry], loaded: dict[str, Any]) -> None:
        self.entries = entries
        self.loaded = dict(loaded)

    def is_loaded(self, name: str) -> bool:
        return name in self.loaded

    def __getitem__(self, name: str) -> Any:
        if name not in self.loaded:
            if name not in self.entries:
                raise KeyError(name)
            self.loaded.update(build(self.entries[name].module))
        return self.loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if self.entries.pop(name, None) is None and name not in self.loaded:
            raise KeyError(name)
        self.loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self.entries, *self.loaded]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self.entries, *self.loaded]))


_BUILT: dict[str, dict[str, Any]] = {}


def build(module: str) -> dict[str, Any]:
    """The click commands of ``module`` (its ``register(app)``), built by typer as they
    are on a group, flags tidied and plain parameters read without pydantic."""
    if module not in _BUILT:
        holder = typer.Typer()
        importlib.import_module(module).register(holder)
        group = typer.main.get_group(holder)
        commands = dict(group.commands)
        for command in commands.values():
            for each in _tree(command):
                tidy_flags(each)
                plain_parameters(each)
        _BUILT[module] = commands
    return _BUILT[module]


def _tree(command: Any) -> Iterator[Any]:
    yield command
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from _tree(sub)


class LazyGroup(FlagsGroup):
    """The top ``shipyard`` group: ``ENTRIES`` (set by the app) name its commands."""

    ENTRIES: dict[str, Entry] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(dict(self.ENTRIES), dict(self.commands))
        self._listing = False

    def main(self, *args: Any, **kwargs: Any) -> Any:
        tidy_flags(self)  # its own; each command's when it is built
        plain_parameters(self)
        return super(FlagsGroup, self).main(*args, **kwargs)  # not FlagsGroup's: it walks all

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        commands = self.commands
        if (
            self._listing
            and isinstance(commands, LazyCommands)
            and cmd_name in commands.entries
            and not commands.is_loaded(cmd_name)
        ):
            return TyperCommand(name=cmd_name, help=commands.entries[cmd_name].help)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # names only: typer's own reads every command

    def _as_listing(self, run: Callable[[], Any]) -> Any:
        self._listing = True
        try:
            return run()
        finally:
            self._listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._as_listing(lambda: super(LazyGroup, self).format_help(ctx, formatter))

    def shell_complete(self, ctx: Any, incomplete: str) -> Any:
        return self._as_listing(lambda: super(LazyGroup, self).shell_complete(ctx, incomplete))


# -- parameters without pydantic -------------------------------------------------------------

_INT = re.compile(r"0|-?[1-9][0-9]{0,17}")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?")
_UNSURE = object()


def plain_value(annotation: Any, value: Any) -> Any:
    """``value`` as pydantic's lax mode reads it for ``annotation``, where that is plain
    (an exact type, a plainly written number); else ``_UNSURE``."""
    if annotation is str:
        return value if type(value) is str else _UNSURE
    if annotation is int:
        if type(value) is int:
            return value
        if type(value) is str and _INT.fullmatch(value):
            return int(value)
        return _UNSURE
    if annotation is float:
        if type(value) is float:
            return value
        if type(value) is str and _FLOAT.fullmatch(value):
            return float(value)
        return _UNSURE
    if annotation == list[str] and type(value) in (list, tuple):
        return list(value) if all(type(v) is str for v in value) else _UNSURE
    return _UNSURE


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        """typer's coercion of one parameter, the plain values read here."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = plain_value(self.annotation, value)
            if plain is not _UNSURE:
                return plain
            typers = build_runtime_param(param.type_descriptor)
            return typers._coerce_value(value, param=param, ctx=ctx)


def plain_parameters(command: Any) -> None:
    """Give ``command``'s plain parameters (str, int, float, list[str], bool; no parser,
    range, choice or file) the coercion above."""
    if RuntimeParam is None:
        return
    help_option = command.get_help_option(typer.Context(command))  # one per command, kept
    for param in [*command.params, help_option]:
        desc = getattr(param, "type_descriptor", None)
        if (
            param is None
            or desc is None
            or not hasattr(param, "_runtime_param")
            or param._runtime_param
        ):
            continue
        info = desc.parameter_info
        if (
            desc.annotation in (str, int, float, bool, list[str])
            and info.parser is None
            and desc.file_annotation is None
            and not desc.is_ranged
            and not desc.is_choice
            and not desc.is_path
        ):
            param._runtime_param = PlainRuntimeParam(
                parameter_info=info, annotation=desc.annotation
            )
