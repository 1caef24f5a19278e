"""The house's arrows point down: checked on the source, not on a running import graph.

Libraries that run inside instances (ps, ddp, tf, mpi, horovod, data, serving, runtime)
never import the layers above them, and the agent imports no framework, so it starts in
a fraction of a second on any instance. Every import statement is read, including the
lazy ones inside functions, so a late ``import`` cannot hide an upward arrow.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard"
UPPER = ("shipyard.agent", "shipyard.control", "shipyard.backends", "shipyard.sdk", "shipyard.cli")
LIBRARIES = ("ps", "ddp", "tf", "mpi", "horovod", "data", "serving", "runtime", "storage")
FRAMEWORKS = ("tensorflow", "torch", "keras", "tf_keras", "horovod", "mpi4py", "ray")


def package_of(path: pathlib.Path) -> list[str]:
    """The dotted package a module file belongs to (its own name for an __init__)."""
    try:
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    except ValueError:  # a file outside the tree: only its absolute imports count
        return []
    return parts[:-1]


def imports(path: pathlib.Path, text: str | None = None) -> list[tuple[int, str]]:
    """Every module a file imports, relative imports resolved (``from ..agent import x``
    inside shipyard/serving is shipyard.agent)."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    package = package_of(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and package:
            base = package[: len(package) - node.level + 1]
            if node.module:
                found.append((node.lineno, ".".join([*base, node.module])))
            else:  # from .. import a, b: a and b may be modules
                found += [(node.lineno, ".".join([*base, a.name])) for a in node.names]
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


def test_agent_loads_no_framework() -> None:
    """What the agent imports at startup, followed through every module it pulls in
    (a library it uses could import a framework at module level)."""
    code = (
        "import sys, pkgutil, importlib, shipyard.agent as a\n"
        "for m in pkgutil.walk_packages(a.__path__, 'shipyard.agent.'):\n"
        "    importlib.import_module(m.name)\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {FRAMEWORKS!r}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC.parent))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", "the agent loaded ML frameworks: " + out.stdout


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: pathlib.Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from shipyard.agent import config\n")
    assert imports(module) == [(2, "shipyard.agent")]
    inside = SRC / "serving" / "transform" / "engine.py"
    assert package_of(inside) == ["shipyard", "serving", "transform"]
    probe = "from ..agent import config\nfrom .. import control\nfrom . import wire\n"
    assert imports(SRC / "ps" / "probe.py", probe) == [
        (1, "shipyard.agent"),
        (2, "shipyard.control"),
        (3, "shipyard.ps.wire"),
    ]
