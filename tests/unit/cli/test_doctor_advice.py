"""``shipyard doctor``'s advice reaches the terminal as written: ``pip install
'shipyard[tensorflow]'`` used to print as ``pip install 'shipyard'`` (rich read
``[tensorflow]`` as a style tag), which installs nothing."""

from __future__ import annotations

import io
import pathlib

import pytest
import tomllib
from rich.console import Console

from shipyard.cli.doctor import Check, checks, table

PYPROJECT = pathlib.Path(__file__).resolve().parents[3] / "pyproject.toml"
EXTRAS = sorted(tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"])


def _shown(found: list[Check]) -> str:
    out = io.StringIO()
    Console(file=out, width=400, color_system=None, highlight=False).print(table(found))
    return out.getvalue()


@pytest.mark.parametrize("extra", EXTRAS)
def test_the_install_advice_names_the_extra(extra: str) -> None:
    advice = f"pip install 'shipyard[{extra}]'"
    shown = _shown([Check(extra, False, f"[{extra}] is not installed", advice)])
    assert advice in shown and f"[{extra}] is not installed" in shown


def test_every_finding_on_this_machine_is_shown_verbatim() -> None:
    found = checks()
    shown = _shown(found)
    for check in found:
        assert check.name in shown and check.detail in shown and check.fix in shown, check
