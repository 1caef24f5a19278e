"""Every SHIPYARD_* variable the code names is listed in shipyard.settings, and the
README's table is the one the settings module generates."""

from __future__ import annotations

import pathlib
import re

from shipyard import settings

ROOT = pathlib.Path(__file__).resolve().parents[3]
# SHIPYARD_PS_* in prose is a family, not a variable: a name never ends with "_".
NAME = re.compile(r"\bSHIPYARD_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")


def names_in(paths: list[pathlib.Path]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in NAME.findall(line):
                found.setdefault(name, f"{path.relative_to(ROOT)}:{number}")
    return found


def test_every_variable_the_code_names_is_listed() -> None:
    sources = sorted((ROOT / "src" / "shipyard").rglob("*.py"))
    missing = {n: where for n, where in names_in(sources).items() if n not in settings.BY_NAME}
    assert missing == {}, (
        "add these to src/shipyard/settings.py (default and meaning): "
        + ", ".join(f"{n} ({where})" for n, where in sorted(missing.items()))
    )


def test_no_listed_variable_is_dead() -> None:
    sources = sorted((ROOT / "src" / "shipyard").rglob("*.py"))
    used = set(names_in([p for p in sources if p.name != "settings.py"]))
    assert sorted(set(settings.BY_NAME) - used) == []


def test_readme_table_is_generated_from_the_settings() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == settings.with_table(readme), (
        "README.md's settings table is stale: python -m shipyard.settings --write README.md"
    )


def test_get_refuses_unlisted_names_and_applies_defaults() -> None:
    assert settings.get("SHIPYARD_STOP_GRACE", {}) == "5"
    assert settings.get("SHIPYARD_STOP_GRACE", {"SHIPYARD_STOP_GRACE": "9"}) == "9"
    try:
        settings.get("SHIPYARD_NOT_A_SETTING", {})
    except KeyError:
        return
    raise AssertionError("an unlisted name was read")


def test_the_scanner_finds_names(tmp_path: pathlib.Path) -> None:
    (tmp_path / "x.py").write_text('os.environ.get("SHIPYARD_NEW_KNOB")  # SHIPYARD_PS_*\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert list(names_in([tmp_path / "x.py"])) == ["SHIPYARD_NEW_KNOB"]
    finally:
        ROOT = saved
