"""The dashboard sits on the top floor beside cli/ and server/: it may import the layers
below it (control, observe), and nothing below imports it (only the CLI starts it)."""

from __future__ import annotations

import pathlib

from tests.unit.house.test_layers import imports

SRC = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard"
TOP = ("cli", "server", "dashboard")


def test_nothing_below_the_top_floor_imports_the_dashboard() -> None:
    upward = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] not in TOP
        for line, name in imports(path)
        if name == "shipyard.dashboard" or name.startswith("shipyard.dashboard.")
    ]
    assert upward == [], "the dashboard imported from below it:\n" + "\n".join(upward)


def test_the_dashboard_imports_no_other_top_floor_package() -> None:
    sideways = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for path in sorted((SRC / "dashboard").rglob("*.py"))
        for line, name in imports(path)
        if name.startswith(("shipyard.cli", "shipyard.server"))
    ]
    assert sideways == [], "\n".join(sideways)


def test_the_old_place_is_gone() -> None:
    assert not (SRC / "observe" / "ui").exists()
    assert (SRC / "dashboard" / "static" / "job.js").is_file()
