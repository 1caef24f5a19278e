"""The shape of shipyard.ps's code (issue 26): classes small enough to read, and parts that
share state receive it rather than declare each other's attributes by hand.

Why a test: both slipped before. ``PSClient`` and ``ServerCore`` were put together from
mixins that re-declared the attributes of the class they would be mixed into (``step:
int``, ``_pending: dict[...]``, ``_drain: Callable[...]``), so no checker could see that
a mixin's assumption and the class's real attribute had drifted apart; and ``PSClient``
was over 400 lines.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PS = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard" / "ps"
MAX_CLASS_LINES = 400
#: classes whose bare annotations are fields (or, for an abstract base, the interface its
#: subclasses provide) by design
_FIELD_BASES = {"ABC", "Protocol", "NamedTuple", "TypedDict", "Enum", "IntEnum"}


def _classes() -> list[tuple[str, ast.ClassDef]]:
    out = []
    for path in sorted(PS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out += [(path.name, n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    return out


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def hand_declared(cls: ast.ClassDef) -> list[str]:
    """Attributes a (non-dataclass) class annotates without a value: state it expects
    someone else to set, the mark of a mixin."""
    if any(_name(d) == "dataclass" for d in cls.decorator_list):
        return []
    if any(_name(b) in _FIELD_BASES for b in cls.bases):
        return []
    return [
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign)
        and s.value is None
        and isinstance(s.target, ast.Name)
        and _name(s.annotation) != "ClassVar"
        and not (
            isinstance(s.annotation, ast.Subscript) and _name(s.annotation.value) == "ClassVar"
        )
    ]


def test_the_checker_sees_a_mixin() -> None:
    mixin = ast.parse("class M:\n    step: int\n    WINDOW: int = 3\n    def f(self): ...\n")
    dc = ast.parse("@dataclass(slots=True)\nclass D:\n    step: int\n")
    m, d = mixin.body[0], dc.body[0]
    assert isinstance(m, ast.ClassDef) and isinstance(d, ast.ClassDef)
    assert hand_declared(m) == ["step"]
    assert hand_declared(d) == []


@pytest.mark.parametrize("where,cls", _classes(), ids=lambda x: getattr(x, "name", x))
def test_no_class_declares_state_it_does_not_own(where: str, cls: ast.ClassDef) -> None:
    assert not hand_declared(cls), (
        f"{where}: {cls.name} declares {hand_declared(cls)} without setting them; "
        "pass what the parts share to their constructors (see client_state.py)"
    )


@pytest.mark.parametrize("where,cls", _classes(), ids=lambda x: getattr(x, "name", x))
def test_no_class_is_over_400_lines(where: str, cls: ast.ClassDef) -> None:
    lines = (cls.end_lineno or cls.lineno) - cls.lineno + 1
    assert lines <= MAX_CLASS_LINES, f"{where}: {cls.name} is {lines} lines; split it by job"
