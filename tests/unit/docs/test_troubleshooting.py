"""Every finding ``shipyard doctor`` can report has a row in docs/troubleshooting.md, so a
new check cannot ship without saying what it means and how to fix it (three of twelve had
none: isolation, cgroups and network emulation, issue 41).

The names are read from cli/doctor.py's source (every ``Check("name", ...)`` and
``_package(..., "name")``), not from running the checks: what a check is called does not
depend on what this machine has, and running them probes namespaces and builds a shim."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCTOR = ROOT / "src" / "shipyard" / "cli" / "doctor.py"
PAGE = ROOT / "docs" / "troubleshooting.md"


def doctor_check_names() -> set[str]:
    """Every literal check name cli/doctor.py builds a Check with."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(DOCTOR.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "Check" and node.args:
            first = node.args[0]
        elif node.func.id == "_package" and len(node.args) >= 4:
            first = node.args[3]  # _package(module, dist, fix, what)
        else:
            continue
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.add(first.value)
    return names


def test_the_names_are_found() -> None:
    """The extraction itself works: the checks the issue names are among those found (an
    extraction that found nothing would make the next test pass vacuously)."""
    names = doctor_check_names()
    assert len(names) >= 12, sorted(names)
    assert {
        "instance sandbox",
        "instance isolation",
        "instance resources (cgroups)",
        "network emulation (shipyard:network)",
        "TensorFlow",
    } <= names


def test_every_doctor_check_has_a_troubleshooting_row() -> None:
    page = PAGE.read_text()
    rows = [line for line in page.splitlines() if line.startswith("| **")]
    missing = sorted(n for n in doctor_check_names() if not any(f"| **{n}**" in r for r in rows))
    assert missing == [], (
        "shipyard doctor reports these, but docs/troubleshooting.md has no row for them "
        "(add '| **NAME** missing | what it means | fix |'): " + ", ".join(missing)
    )
