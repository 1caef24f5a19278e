"""The site's reference pages, generated from the code at build time so they cannot drift.

An MkDocs hook (``mkdocs.yml``: ``hooks``): ``on_files`` adds four pages that exist only in
the built site, each read from the definition the product itself uses:

- ``reference/cli.md``: every ``shipyard`` command and option, from the Typer app's click
  commands (what ``--help`` prints);
- ``reference/sdk.md``: the SDK's public classes and functions (``shipyard.__all__``), their
  signatures and docstrings;
- ``reference/settings.md``: every ``SHIPYARD_*`` setting with its default and meaning, from
  ``shipyard.settings``;
- ``reference/api.md``: the SageMaker API operations ``shipyard server`` routes, from the
  server's own operation table.

``tests/unit/docs`` imports the same functions and fails when an option, argument or setting
has no entry.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Iterator
from typing import Any

PAGES = {
    "reference/cli.md": "cli_reference",
    "reference/sdk.md": "sdk_reference",
    "reference/settings.md": "settings_reference",
    "reference/api.md": "api_reference",
}


def _cell(text: object) -> str:
    """A value made safe for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ---------------------------------------------------------------- the command line


def cli_commands() -> Iterator[tuple[str, Any]]:
    """``(full name, command)`` for ``shipyard`` and every sub-command, depth first."""
    import typer.main

    from shipyard.cli.app import app

    root = typer.main.get_command(app)

    def walk(name: str, cmd: Any) -> Iterator[tuple[str, Any]]:
        yield name, cmd
        if hasattr(cmd, "list_commands"):  # a group (Typer's own click, not always click's)
            ctx = type(cmd).context_class(cmd)
            for sub in sorted(cmd.list_commands(ctx)):
                child = cmd.get_command(ctx, sub)
                if child is not None and not child.hidden:
                    yield from walk(f"{name} {sub}", child)

    yield from walk("shipyard", root)


def _option_row(param: Any) -> str:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    if param.param_type_name == "argument":
        names = f"`{(param.name or '').upper()}` (argument)"
    help_text = getattr(param, "help", None) or ""
    default = param.default
    shown = "" if default in (None, (), [], False) or callable(default) else f"`{default}`"
    if getattr(param, "is_flag", False):
        shown = "flag"
    required = " (required)" if param.required else ""
    return f"| {names}{required} | {shown} | {_cell(help_text)} |"


def cli_reference() -> str:
    lines = [
        "# Command line",
        "",
        "Every `shipyard` command and option, generated from the command line's own "
        "definitions (the same text `shipyard COMMAND --help` prints).",
        "",
    ]
    for name, cmd in cli_commands():
        depth = min(name.count(" ") + 2, 4)
        lines += [f"{'#' * depth} `{name}`", ""]
        doc = inspect.cleandoc(cmd.help or "")
        if doc:
            lines += [doc, ""]
        params = [p for p in cmd.params if p.name != "help" and not getattr(p, "hidden", False)]
        if params:
            lines += ["| option | default | meaning |", "| --- | --- | --- |"]
            lines += [_option_row(p) for p in params]
            lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- the SDK


def sdk_objects() -> Iterator[tuple[str, Any]]:
    """``(name, object)`` for every public name ``shipyard`` exports."""
    import shipyard

    for name in shipyard.__all__:
        yield name, getattr(shipyard, name)


def sdk_parameters(obj: Any) -> list[str]:
    """The documented parameters of a class (its ``__init__``) or function."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in sig.parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def sdk_reference() -> str:
    lines = [
        "# Python SDK",
        "",
        "The public names of `import shipyard` (as `import sagemaker` offers them), with "
        "their arguments and docstrings, generated from the code.",
        "",
    ]
    for name, obj in sdk_objects():
        kind = "class" if inspect.isclass(obj) else "function"
        lines += [f"## `shipyard.{name}`", "", f"*{kind}* from `{obj.__module__}`", ""]
        target = obj.__init__ if inspect.isclass(obj) else obj
        try:
            sig = str(inspect.signature(target)).replace("(self, ", "(").replace("(self)", "()")
            lines += ["```python", f"{name}{sig}", "```", ""]
        except (TypeError, ValueError):
            pass
        doc = inspect.getdoc(obj) or ""
        if doc:
            lines += [doc, ""]
        params = sdk_parameters(obj)
        if params:
            lines += ["Arguments: " + ", ".join(f"`{p}`" for p in params), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- settings


def settings_entries() -> list[Any]:
    from shipyard import settings

    return list(settings.SETTINGS)


def settings_reference() -> str:
    lines = [
        "# Settings",
        "",
        "Every `SHIPYARD_*` environment variable, generated from the settings registry "
        "(`src/shipyard/settings.py`). *user* settings are yours to set (in the shell, or in a "
        "job's `environment` where they concern the instance); *internal* ones are set by "
        "shipyard for its own processes and listed so nobody reuses a name. "
        "`shipyard doctor --settings` prints each with its value on this machine.",
        "",
        "| variable | default | for | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for s in settings_entries():
        default = "unset" if s.default is None else f"`{s.default}`"
        lines.append(f"| `{s.name}` | {default} | {s.audience} | {_cell(s.meaning)} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the server's API


def api_operations() -> dict[str, list[str]]:
    """The operations ``shipyard server`` answers, per service, read from the services it
    builds (over a throw-away home, so nothing of the user's is touched)."""
    from shipyard.server import services

    with tempfile.TemporaryDirectory(prefix="shipyard-docs-") as home:
        built = services.build(home)
        found: dict[str, list[str]] = {}
        for service, api in built.items():
            ops = getattr(api, "operations", None) or getattr(
                getattr(api, "contract", None), "operations", None
            )
            if isinstance(ops, (dict, set, frozenset)) and ops:
                found[service] = sorted(_operation_name(op) for op in ops)
        return found


def _operation_name(key: str) -> str:
    """``CreateTrainingJob`` whether the table is keyed by it or by ``create_training_job``."""
    return key if not key.islower() else "".join(w.title() for w in key.split("_"))


def api_reference() -> str:
    lines = [
        "# SageMaker API operations",
        "",
        "What `shipyard server` answers, generated from its own operation table. Anything "
        "else is refused with the error AWS gives for an unknown operation. S3, STS, IAM and "
        "the runtime's `InvokeEndpoint` are described in "
        "[the server's concept page](../concepts/server.md).",
        "",
    ]
    for service, ops in sorted(api_operations().items()):
        lines += [f"## `{service}`", ""]
        lines += [f"- `{op}`" for op in ops]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- the MkDocs hook


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    os.environ.setdefault("SHIPYARD_PROGRESS", "off")
    for uri, builder in PAGES.items():
        files.append(File.generated(config, uri, content=globals()[builder]()))
    return files
