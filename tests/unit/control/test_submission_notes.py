"""What a job is told at submission when it will not get what it asked for (issue 16 item 7):
framework_version / py_version that differ from what is installed, local_gpu without a GPU.
One line each, and none when all matches."""

from __future__ import annotations

import sys

import pytest

from shipyard import instance_types
from shipyard.control import versions

PY = f"py{sys.version_info.major}{sys.version_info.minor}"


@pytest.fixture
def installed(monkeypatch):
    table = {"torch": "2.13.0+cpu", "tensorflow": "2.21.0"}
    monkeypatch.setattr(versions, "installed_version", table.get)
    return table


def test_matching_versions_say_nothing(installed):
    assert versions.notes("pytorch", "2.13", PY) == []
    assert versions.notes("pytorch", "2.13.0", None) == []
    assert versions.notes("tensorflow", "2.21", PY) == []
    assert versions.notes(None, None, None) == []


def test_a_framework_version_that_differs_says_what_runs_instead(installed):
    [line] = versions.notes("tensorflow", "2.11", PY)
    assert "framework_version '2.11'" in line and "TensorFlow 2.21.0" in line, line
    [line] = versions.notes("pytorch", "1.13.1", PY)
    assert "PyTorch 2.13.0+cpu" in line, line


def test_a_py_version_that_differs_says_what_runs_instead(installed):
    [line] = versions.notes("pytorch", "2.13", "py38")
    assert "py_version 'py38'" in line and f"Python {sys.version_info.major}." in line, line


def test_a_framework_that_is_not_installed_is_named(installed):
    installed.pop("tensorflow")
    [line] = versions.notes("tensorflow", "2.21", None)
    assert "TensorFlow is not installed" in line and "shipyard[tensorflow]" in line, line


def test_both_differing_give_one_line(installed):
    assert len(versions.notes("tensorflow", "2.3", "py37")) == 1


def test_local_gpu_without_a_gpu_says_it_runs_on_cpus(monkeypatch):
    monkeypatch.setattr(instance_types, "machine_gpus", lambda: 0)
    line = instance_types.resolve("local_gpu").describe()
    assert "no GPU" in line and "CPU" in line, line
    monkeypatch.setattr(instance_types, "machine_gpus", lambda: 2)
    assert "no GPU" not in instance_types.resolve("local_gpu").describe()
