"""One error tree: every exception class shipyard defines is a ``ShipyardError``, so a
caller (the CLI, the server, a user's script) can catch everything shipyard raises on
purpose with one ``except``, and the subclasses it already caught (ValueError, KeyError,
TimeoutError) keep working."""

from __future__ import annotations

import ast
import importlib
import pathlib

from shipyard.errors import ShipyardError
from tests.unit.sources import parsed

SRC = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard"
# signals that steer control flow inside one module and never reach a caller
CONTROL_FLOW = {
    "shipyard.control.supervisor.StopRequested",  # a signal handler ends the monitor loop
    "shipyard.http.protocol._HeadTooLarge",  # out of an httptools callback: answer 431
    "shipyard.http.protocol._Refused",  # out of an httptools callback: stop parsing
    "shipyard.server.compose.serve._Stop",
    # an instance's pid 1 runs with `python -S` (stdlib only): it prints what it refused
    "shipyard.sandbox.viewbuild.Refused",  # a SIGTERM handler ends the local endpoint's loop
}


def exception_classes(root: pathlib.Path) -> list[tuple[str, str]]:
    """(module, class) of every class named ...Error/...Exception or derived (by name, to
    any depth) from one, found on the source: no module has to be imported to be listed."""
    classes = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                classes.append((module, node.name, bases))
    errors = {n for _, n, _ in classes if n.endswith(("Error", "Exception"))}
    errors |= {"Exception", "BaseException"}
    while True:
        more = {n for _, n, bases in classes if bases & errors} - errors
        if not more:
            break
        errors |= more
    return [(m, n) for m, n, bases in classes if n in errors]


def test_every_shipyard_exception_is_a_shipyard_error() -> None:
    outside = []
    for module, name in exception_classes(SRC):
        if f"{module}.{name}" in CONTROL_FLOW:
            continue
        cls = getattr(importlib.import_module(module), name)
        if (
            isinstance(cls, type)
            and issubclass(cls, BaseException)
            and not issubclass(cls, ShipyardError)
        ):
            outside.append(f"{module}.{name}")
    assert outside == [], "root these in shipyard.errors.ShipyardError: " + ", ".join(outside)


def test_the_finder_lists_error_classes(tmp_path: pathlib.Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "class Oops(Exception): ...\nclass BadThing(Oops): ...\nclass Plain: ...\n"
    )
    assert exception_classes(pkg) == [("pkg.m", "Oops"), ("pkg.m", "BadThing")]


def test_the_named_errors_are_in_the_tree() -> None:
    from shipyard.control.store import CorruptRecordError
    from shipyard.ps.errors import PSConfigError, PSError, PSTimeoutError
    from shipyard.server.errors import ApiError

    for cls in (PSError, ApiError, CorruptRecordError):
        assert issubclass(cls, ShipyardError)
    assert issubclass(PSConfigError, ValueError) and issubclass(PSTimeoutError, TimeoutError)
