"""The house's arrows point down: checked on the source, not on a running import graph.

Libraries that run inside instances (ps, ddp, tf, mpi, horovod, data, serving, runtime)
never import the layers above them, and the agent imports no framework, so it starts in
a fraction of a second on any instance. Every import statement is read, including the
lazy ones inside functions, so a late ``import`` cannot hide an upward arrow.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard"
UPPER = ("shipyard.agent", "shipyard.control", "shipyard.backends", "shipyard.sdk", "shipyard.cli")
LIBRARIES = ("ps", "ddp", "tf", "mpi", "horovod", "data", "serving", "runtime", "storage")
FRAMEWORKS = ("tensorflow", "torch", "keras", "tf_keras", "horovod", "mpi4py", "ray")


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def modules_under(package: str) -> list[pathlib.Path]:
    return sorted((SRC / package).rglob("*.py"))


@pytest.mark.parametrize("package", LIBRARIES)
def test_runtime_libraries_never_import_upper_layers(package: str) -> None:
    upward = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for path in modules_under(package)
        for line, name in imports(path)
        if name.startswith(UPPER)
    ]
    assert upward == [], "imports pointing up the layers:\n" + "\n".join(upward)


def test_agent_imports_no_framework() -> None:
    heavy = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for path in modules_under("agent")
        for line, name in imports(path)
        if name.split(".")[0] in FRAMEWORKS
    ]
    assert heavy == [], "the agent must start without ML frameworks:\n" + "\n".join(heavy)


def test_control_and_backends_never_import_sdk_or_cli() -> None:
    upward = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for package in ("control", "backends", "spec.py")
        for path in ([SRC / package] if package.endswith(".py") else modules_under(package))
        for line, name in imports(path)
        if name.startswith(("shipyard.sdk", "shipyard.cli"))
    ]
    assert upward == [], "\n".join(upward)


def test_the_checker_sees_lazy_imports(tmp_path: pathlib.Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from shipyard.agent import config\n")
    assert imports(module) == [(2, "shipyard.agent")]
