"""The built package is what a user installs: a wheel from this tree carries the license and the
``py.typed`` marker (so users' type checkers read shipyard's hints), declares its license as an
SPDX expression, and builds without setuptools' deprecation warnings."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_wheel_carries_license_and_py_typed_and_builds_without_deprecations(tmp_path: Path) -> None:
    # no build isolation: the venv's setuptools builds it, so nothing is fetched
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PIP_NO_INPUT="1"),
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    log = out.stdout + out.stderr
    warnings = [
        line for line in log.splitlines() if "deprecat" in line.lower() and "Location" not in line
    ]
    assert not warnings, warnings
    (wheel,) = tmp_path.glob("shipyard-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta_name).decode()
        license_name = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        license_text = zf.read(license_name).decode()
    assert "shipyard/py.typed" in names
    assert "Apache License" in license_text and "Version 2.0" in license_text
    assert "License-Expression: Apache-2.0" in metadata
    assert "Classifier: Typing :: Typed" in metadata
