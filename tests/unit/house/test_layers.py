"""The house's arrows point down: checked on the source, not on a running import graph.

The floors are one list, ``shipyard/floors.py``: every package is on a floor and imports
only packages on floors below its own, so no cycle can close between packages, libraries
that run inside instances (ps, ddp, tf, mpi, horovod, data, serving, runtime) never import
the control plane, and the agent imports no framework, so it starts in a fraction of a
second on any instance. Inside a package, no two modules import each other (directly or
round a longer circle). Every import statement is read, including the lazy ones inside
functions, so a late ``import`` cannot hide an upward arrow.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

from shipyard import floors
from tests.unit.sources import parsed

SRC = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard"
FRAMEWORKS = ("tensorflow", "torch", "keras", "tf_keras", "horovod", "mpi4py", "ray")
# the importable stand-ins of other projects' packages (``import horovod`` in a user's
# script): they import shipyard by its absolute name, so they are read as shipyard's own
SHIMS = ("_shim", "_shims")


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
    tree = parsed(path) if text is None else ast.parse(text, str(path))
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


def module_name(path: pathlib.Path) -> str:
    """``agent/runners/mpi.py`` -> ``agent.runners.mpi``; a package is its __init__."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    base = SRC.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def shipyard_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """The shipyard modules a file imports, relative to ``shipyard`` (``from shipyard
    import settings`` is ``settings``; ``from shipyard.ps import wire`` is ``ps.wire``)."""
    tree = parsed(path)
    package = package_of(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names = [(node.lineno, module)]
            names += [(node.lineno, f"{module}.{a.name}") for a in node.names]
        else:
            continue
        for line, name in names:
            if name.startswith("shipyard.") and _is_module(name[len("shipyard.") :]):
                found.append((line, name[len("shipyard.") :]))
    return found


def source_files() -> list[pathlib.Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if p.name != "__init__.py" or p.parent != SRC]


def test_every_package_is_on_a_floor() -> None:
    missing = sorted(
        {module_name(p) for p in source_files() if floors.floor_of(module_name(p)) is None}
    )
    assert missing == [], "put these on a floor in src/shipyard/floors.py: " + ", ".join(missing)


def test_no_floor_lists_a_package_that_is_not_there() -> None:
    listed = {name for floor in floors.FLOORS for name in floor}
    stale = sorted(n for n in listed - floors.PENDING if not _is_module(n))
    assert stale == [], "floors.py lists packages that do not exist: " + ", ".join(stale)


def test_imports_point_only_to_lower_floors() -> None:
    upward = []
    for path in source_files():
        here = module_name(path)
        mine, floor = floors.entry_of(here), floors.floor_of(here)
        for line, name in shipyard_imports(path):
            target = floors.entry_of(name)
            if target is None or target == mine or floor is None:
                continue
            if floors.floor_of(name) <= floor:  # type: ignore[operator]
                upward.append(f"{path.relative_to(SRC)}:{line}: {here} -> {name}")
    assert upward == [], (
        "imports that do not point down the floors of src/shipyard/floors.py:\n" + "\n".join(upward)
    )


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (a package's import of its own __init__ left out:
    a package re-exporting its parts is not a cycle of responsibilities)."""
    edges: dict[str, set[str]] = {}
    for path in source_files():
        here = module_name(path)
        for _, name in shipyard_imports(path):
            if name != here and not here.startswith(name + "."):
                edges.setdefault(here, set()).add(name)
    return edges


def test_no_cycle_between_packages_or_inside_one() -> None:
    found = [" <-> ".join(c) for c in cycles(module_graph())]
    assert found == [], (
        "import cycles (break them by moving the shared part below both):\n" + "\n".join(found)
    )


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_agent_imports_no_framework() -> None:
    heavy = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for path in modules_under("agent")
        for line, name in imports(path)
        if name.split(".")[0] in FRAMEWORKS
    ]
    assert heavy == [], "the agent must start without ML frameworks:\n" + "\n".join(heavy)


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


def test_the_architecture_page_shows_the_floors_of_floors_py() -> None:
    """docs/architecture.md's table is the list, floor by floor, in order: a newcomer's map
    that cannot drift from the one the imports are checked against."""
    page = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    begin, end = "<!-- floors:begin", "<!-- floors:end -->"
    table = page[page.index(begin) : page.index(end)].splitlines()[3:]
    shown = [tuple(c.strip("`") for c in row.split("|")[2].split()) for row in table if row.strip()]
    assert shown == list(floors.FLOORS), "update docs/architecture.md's floors table"
