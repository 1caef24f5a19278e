"""The site's reference pages, generated from the code at build time so they cannot drift.

An MkDocs hook (``mkdocs.yml``: ``hooks``): ``on_files`` adds four pages that exist only in
the built site, each read from the definition the product itself uses:

- ``reference/cli.md``: every ``shipyard`` command and option, from the Typer app's click
  commands (what ``--help`` prints);
- ``reference/sdk.md``: the SDK's public classes and functions (``shipyard.__all__``): each
  constructor and public method with a table of its arguments (type and default from the
  signature, meaning from the docstring's Google-style ``Args:`` section). What ``**kwargs``
  stands for is listed too: a base class's ``__init__`` arguments, or those of the function a
  ``Forwards: Model.deploy`` line in the docstring names. Inherited methods are written out
  once, under the class that defines them, and linked from its subclasses;
- ``reference/settings.md``: every ``SHIPYARD_*`` setting with its default and meaning, from
  ``shipyard.settings``;
- ``reference/api.md``: the SageMaker API operations ``shipyard server`` routes, from the
  server's own operation table.

``tests/unit/docs`` imports the same functions and fails when an option, argument or setting
has no entry.
"""

from __future__ import annotations

import html
import inspect
import os
import re
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
    # only "no default" is left blank: 0 and False are defaults a reader needs to see
    # (``0 in (None, False)`` is true, so the test is by identity and type, not ``in``)
    absent = (
        default is None or callable(default) or (isinstance(default, (list, tuple)) and not default)
    )
    shown = "" if absent else f"`{default}`"
    if getattr(param, "is_flag", False):
        shown = f"`{bool(default)}` (a flag)"
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

# The page's reading order: the names a notebook meets first come first. A name exported by
# ``shipyard`` but missing here still gets its section, under "Other names".
SDK_GROUPS = {
    "Training": ["Estimator", "TensorFlow", "PyTorch", "EstimatorBase", "Framework"],
    "Inputs and sessions": [
        "TrainingInput",
        "s3_input",
        "Session",
        "LocalSession",
        "get_execution_role",
        "TrainingJobAnalytics",
    ],
    "Hosting and batch transform": [
        "Model",
        "TensorFlowModel",
        "PyTorchModel",
        "Predictor",
        "TensorFlowPredictor",
        "PyTorchPredictor",
        "Transformer",
    ],
}
_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Forwards):\s*(.*)$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)(?:\s*\(([^)]*)\))?:\s*(.*)$")


def sdk_objects() -> Iterator[tuple[str, Any]]:
    """``(name, object)`` for every public name ``shipyard`` exports."""
    import shipyard

    for name in shipyard.__all__:
        yield name, getattr(shipyard, name)


def _own_doc(obj: Any) -> str:
    """The object's own docstring, never one inherited from a base class (a subclass
    without one would otherwise show its base's text as if it were its own)."""
    raw = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(raw) if isinstance(raw, str) else ""


def parse_doc(doc: str) -> tuple[str, dict[str, tuple[str, str]], dict[str, str]]:
    """A Google-style docstring split into its prose, its ``Args:`` entries (name ->
    (type written in the docstring, meaning)) and its other sections (``Returns:``,
    ``Raises:``, ``Forwards:``) as one line of text each."""
    prose: list[str] = []
    args: dict[str, tuple[str, str]] = {}
    sections: dict[str, str] = {}
    section = ""
    current = ""
    for line in doc.splitlines():
        head = _SECTION.match(line)
        if head:
            section, current = head.group(1).replace("Arguments", "Args"), ""
            if head.group(2):
                sections[section] = head.group(2).strip()
            continue
        if section and line and not line[0].isspace():
            section = ""  # a line back at the margin ends the section
        if not section:
            prose.append(line)
            continue
        text = line.strip()
        if not text:
            continue
        entry = _ENTRY.match(text) if section == "Args" and line[4:5] != " " else None
        if entry:
            current = entry.group(1).lstrip("*")
            args[current] = (entry.group(2) or "", entry.group(3))
        elif section == "Args" and current:
            kind, meaning = args[current]
            args[current] = (kind, f"{meaning} {text}")
        else:
            sections[section] = f"{sections.get(section, '')} {text}".strip()
    return "\n".join(prose).strip(), args, sections


def _bases_with(cls: Any, method: str) -> list[Any]:
    """The same-named function of every class of ``cls``'s MRO that defines it."""
    return [vars(c)[method] for c in cls.__mro__ if method in vars(c)]


def _forwarded(owner: Any, doc: str) -> list[Any]:
    """The functions named in a docstring's ``Forwards:`` section (``Model.deploy``): a
    method that takes ``*args, **kwargs`` and passes them on documents theirs."""
    import shipyard

    _, _, sections = parse_doc(doc)
    found = []
    for ref in re.findall(r"`?(\w+)\.(\w+)`?", sections.get("Forwards", "")):
        target = getattr(getattr(shipyard, ref[0], None), ref[1], None)
        if target is not None:
            found.append(target)
    return found


def sdk_arguments(owner: Any, func: Any, method: str) -> list[dict[str, str]]:
    """Every argument ``func`` takes: its own, then what ``**kwargs`` stands for (the base
    class's ``__init__`` arguments, or a ``Forwards:`` target's), each with type, default
    and meaning. A meaning comes from the function's ``Args:`` section, else from the same
    method's docstring up the class hierarchy."""
    related = [func]
    if owner is not None:
        related += [f for f in _bases_with(owner, method) if f is not func]
    related += _forwarded(owner, _own_doc(func))
    meanings: dict[str, tuple[str, str]] = {}
    for f in reversed(related):
        meanings.update(parse_doc(_own_doc(f))[1])
    rows: dict[str, dict[str, str]] = {}
    sources = [func]
    try:
        kinds = {p.kind for p in inspect.signature(func).parameters.values()}
    except (TypeError, ValueError):
        kinds = set()
    takes_more = inspect.Parameter.VAR_KEYWORD in kinds
    # what *args, **kwargs stand for may be given by position; what **kwargs alone stands
    # for only by keyword
    keyword_only = "" if inspect.Parameter.VAR_POSITIONAL in kinds else "yes"
    if takes_more:
        sources += related[1:]
    for source in sources:
        try:
            params = inspect.signature(source).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.name in ("self", "cls") or p.name in rows:
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            kind = p.annotation if p.annotation is not p.empty else ""
            rows[p.name] = {
                "inherited": keyword_only if source is not func else "",
                "name": p.name,
                "type": str(kind),
                "default": "required" if p.default is p.empty else repr(p.default),
                "meaning": meanings.get(p.name, ("", ""))[1],
            }
        if not takes_more:
            break
    for name, (kind, meaning) in parse_doc(_own_doc(func))[1].items():
        if name not in rows and not name.startswith("kwargs"):  # documented, passed on
            rows[name] = {
                "inherited": "yes",  # taken from **kwargs: by keyword only
                "name": name,
                "type": f"{kind} | None" if kind and "None" not in kind else kind,
                "default": "None",
                "meaning": meaning,
            }
    return list(rows.values())


def sdk_parameters(obj: Any) -> list[str]:
    """The documented parameters of a class (its ``__init__``) or function."""
    if inspect.isclass(obj):
        return [r["name"] for r in sdk_arguments(obj, obj.__init__, "__init__")]
    return [r["name"] for r in sdk_arguments(None, obj, obj.__name__)]


def sdk_methods(cls: Any) -> Iterator[tuple[str, Any, Any]]:
    """``(name, function or property, defining class)`` for each public method and
    property of ``cls``, its own first, then those inherited from shipyard's classes."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("shipyard"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(member, (classmethod, staticmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                seen.add(name)
                yield name, member, klass


def _anchor(*parts: str) -> str:
    return "-".join(parts)


def _signature(title: str, rows: list[dict[str, str]], more: bool) -> list[str]:
    args: list[str] = []
    for r in rows:
        if r["inherited"] and "*" not in args:
            args.append("*")  # what **kwargs stands for: keyword arguments
        args.append(
            r["name"]
            + (f": {r['type']}" if r["type"] else "")
            + ("" if r["default"] == "required" else f" = {r['default']}")
        )
    if more:
        args.append("**kwargs")
    one = f"{title}({', '.join(args)})"
    if len(one) > 88:
        one = f"{title}(\n" + "".join(f"    {a},\n" for a in args) + ")"
    return ["```python", one, "```", ""]


def _code(text: str) -> str:
    """Inline code safe inside a Markdown table cell (a type's ``|`` is no column break)."""
    return f"<code>{html.escape(text).replace('|', '&#124;')}</code>"


def _argument_table(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return []
    lines = ["| argument | type | default | meaning |", "| --- | --- | --- | --- |"]
    for r in rows:
        kind = _code(r["type"]) if r["type"] else ""
        default = "*required*" if r["default"] == "required" else _code(r["default"])
        lines.append(f"| {_code(r['name'])} | {kind} | {default} | {_cell(r['meaning'])} |")
    return [*lines, ""]


def _doc_text(doc: str) -> list[str]:
    """A docstring's prose, and where its arguments are another function's, a link there."""
    prose, _, sections = parse_doc(doc)
    lines = [prose, ""] if prose else []
    refs = re.findall(r"(\w+)\.(\w+)", sections.get("Forwards", ""))
    if refs:
        links = ", ".join(f"[`{c}.{m}`](#{_anchor(c, m)})" for c, m in refs)
        lines += [f"Takes the arguments of {links} too (listed below).", ""]
    return lines


def _doc_tail(doc: str) -> list[str]:
    """A docstring's ``Returns:`` and ``Raises:``, after the argument table."""
    _, _, sections = parse_doc(doc)
    return [
        line
        for name in ("Returns", "Raises")
        if name in sections
        for line in (f"**{name}:** {sections[name]}", "")
    ]


def _takes_kwargs(func: Any) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in params)


def _class_section(name: str, cls: Any) -> list[str]:
    bases = [b.__name__ for b in cls.__bases__ if b.__module__.startswith("shipyard")]
    kind = "class" + (f", a `{bases[0]}`" if bases else "")
    lines = [f"### `shipyard.{name}` {{#{name}}}", "", f"*{kind}* from `{cls.__module__}`", ""]
    init = cls.__init__
    rows = sdk_arguments(cls, init, "__init__")
    lines += _signature(name, rows, _takes_kwargs(_bases_with(cls, "__init__")[-1]))
    lines += _doc_text(_own_doc(cls))
    own_init = _own_doc(init) if "__init__" in vars(cls) else ""
    lines += _doc_text(own_init) + _argument_table(rows) + _doc_tail(own_init)
    inherited: dict[str, list[str]] = {}
    for method, member, owner in sdk_methods(cls):
        if owner is not cls and owner.__name__ in _exported():
            inherited.setdefault(owner.__name__, []).append(method)
            continue
        lines += [f"#### `{name}.{method}` {{#{_anchor(name, method)}}}", ""]
        if isinstance(member, property):
            lines += ["*property*", ""] + _doc_text(_own_doc(member.fget))
            continue
        rows = sdk_arguments(cls, member, method)
        lines += _signature(f"{name}.{method}", rows, _takes_kwargs(member))
        doc = _own_doc(member)
        lines += _doc_text(doc) + _argument_table(rows) + _doc_tail(doc)
    for owner_name, methods in inherited.items():
        links = ", ".join(f"[`{m}`](#{_anchor(owner_name, m)})" for m in methods)
        lines += [f"Inherited from [`shipyard.{owner_name}`](#{owner_name}): {links}.", ""]
    return lines


def _exported() -> set[str]:
    import shipyard

    return {
        getattr(shipyard, n).__name__
        for n in shipyard.__all__
        if getattr(shipyard, n).__name__ == n
    }


def _function_section(name: str, func: Any) -> list[str]:
    lines = [f"### `shipyard.{name}` {{#{name}}}", "", f"*function* from `{func.__module__}`", ""]
    rows = sdk_arguments(None, func, name)
    lines += _signature(name, rows, _takes_kwargs(func))
    doc = _own_doc(func)
    return lines + _doc_text(doc) + _argument_table(rows) + _doc_tail(doc)


def sdk_reference() -> str:
    objects = dict(sdk_objects())
    lines = [
        "# Python SDK",
        "",
        "The public names of `import shipyard` (as `import sagemaker` offers them), generated "
        "from the code: each class's constructor and public methods with every argument's "
        "type, default and meaning. Arguments the SageMaker SDK accepts that mean nothing "
        "without AWS (`role`, `subnets`, ...) are accepted and ignored.",
        "",
    ]
    placed = [n for names in SDK_GROUPS.values() for n in names]
    groups = {**SDK_GROUPS, "Other names": [n for n in objects if n not in placed]}
    for group, names in groups.items():
        names = [n for n in names if n in objects]
        if not names:
            continue
        lines += [f"## {group}", ""]
        for name in names:
            obj = objects[name]
            if getattr(obj, "__name__", name) != name:  # an alias: LocalSession = Session
                lines += [
                    f"### `shipyard.{name}` {{#{name}}}",
                    "",
                    f"The same {'class' if inspect.isclass(obj) else 'function'} as "
                    f"[`shipyard.{obj.__name__}`](#{obj.__name__}) (SageMaker's name for it).",
                    "",
                ]
            elif inspect.isclass(obj):
                lines += _class_section(name, obj)
            else:
                lines += _function_section(name, obj)
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
