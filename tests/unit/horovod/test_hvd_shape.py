"""The engine's shape (issue 26): parts split by what they do, each under 400 lines, and
composed, not inherited. A class that grows past the limit, or an engine that goes back to
inheriting its parts, fails here rather than in review."""

from __future__ import annotations

import ast
import pathlib

from tests.unit.sources import parsed

import shipyard.horovod as hvd

HOROVOD = pathlib.Path(hvd.__file__).parent
MAX_CLASS_LINES = 400


def _classes(root: pathlib.Path):
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(root.parent), node


def test_no_class_in_horovod_or_serving_is_over_400_lines() -> None:
    roots = (HOROVOD, HOROVOD.parent / "serving")
    big = [
        f"{path}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for root in roots
        for path, node in _classes(root)
        if node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]
    assert not big, big


def _hand_declared(cls: ast.ClassDef) -> list[str]:
    """Attributes a class annotates without a value (not ClassVar): state it expects some
    other class to set, the mark of a mixin sharing hand-declared state."""
    return [
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign)
        and s.value is None
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    ]


def test_no_class_in_horovod_declares_state_it_does_not_set() -> None:
    found = [
        f"{path}:{node.name} {_hand_declared(node)}"
        for path, node in _classes(HOROVOD)
        if not any("dataclass" in ast.unparse(d) for d in node.decorator_list)
        and not any(ast.unparse(b) in ("Protocol", "NamedTuple") for b in node.bases)
        and _hand_declared(node)
    ]
    assert not found, found


def test_the_engine_composes_its_parts() -> None:
    from shipyard.horovod import engine

    assert engine.Engine.__bases__ == (object,)
