"""Which Pythons a framework environment can be built in: pyenv's versions (also those its
shims do not select), uv's managed Pythons, pythonX.Y on PATH (never a pyenv shim), and the
tags a wheel needs for each, computed without starting it."""

from __future__ import annotations

import os
import stat
import sys

from shipyard.environments import interpreters, registry


def _exe(path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_pyenv_and_uv_pythons_are_found_the_newest_patch_first(tmp_path, monkeypatch):
    pyenv, uv = tmp_path / "pyenv", tmp_path / "uv"
    _exe(pyenv / "versions" / "3.7.9" / "bin" / "python3.7")
    newest = _exe(pyenv / "versions" / "3.7.16" / "bin" / "python3.7")
    (pyenv / "versions" / "3.7-dev" / "bin").mkdir(parents=True)  # not a release: ignored
    managed = _exe(uv / "cpython-3.8.20-linux-x86_64-gnu" / "bin" / "python3.8")
    shims = tmp_path / "shims"
    _exe(shims / "python3.9")  # a pyenv shim fails for an unselected version: never taken
    monkeypatch.setenv("PYENV_ROOT", str(pyenv))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(uv))
    monkeypatch.setenv("PATH", f"{shims}:{os.path.dirname(sys.executable)}")
    found = interpreters.available()
    assert found["3.7"] == newest and found["3.8"] == managed
    assert "3.9" not in found
    assert found[interpreters.this_python()] == sys.executable


def test_py_version_names_a_minor_version():
    assert interpreters.from_py_version("py37") == "3.7"
    assert interpreters.from_py_version("py310") == "3.10"
    assert interpreters.from_py_version("py3") is None
    assert interpreters.from_py_version(None) is None


def test_wheel_tags_of_another_python():
    """TensorFlow 1.13.1's cp37m wheel installs in 3.7, not in 3.8; a pure wheel in both."""
    files = [
        "tensorflow-1.13.1-cp37-cp37m-manylinux1_x86_64.whl",
        "tensorflow_cpu-2.4.1-cp38-cp38-manylinux2010_x86_64.whl",
        "six-1.16.0-py2.py3-none-any.whl",
    ]
    assert registry.installable_versions(files[:2], registry.tags_for("3.7")) == ["1.13.1"]
    assert registry.installable_versions(files[:2], registry.tags_for("3.8")) == ["2.4.1"]
    assert registry.installable_versions(files[2:], registry.tags_for("3.7")) == ["1.16.0"]
