"""No job's environment is built in a Python older than shipyard's in-job parts run in
(3.7: they use ``from __future__ import annotations``, which 3.6 cannot compile), and a
refusal names the nearest release that would run here. The registry is a list of wheel
file names given here (TensorFlow 1.12 has wheels for 3.6 only, 1.13 for 3.6 and 3.7, as
PyPI has them); no index is asked."""

from __future__ import annotations

import pytest

from shipyard.environments import interpreters, job, registry

PLATFORM = "manylinux1_x86_64"
WHEELS = {
    "tensorflow": [
        f"tensorflow-1.12.0-cp36-cp36m-{PLATFORM}.whl",
        f"tensorflow-1.13.2-cp36-cp36m-{PLATFORM}.whl",
        f"tensorflow-1.13.2-cp37-cp37m-{PLATFORM}.whl",
    ],
    "tensorflow-cpu": [f"tensorflow_cpu-2.21.0-cp311-cp311-{PLATFORM}.whl"],
}


@pytest.fixture
def machine(monkeypatch):
    """Pythons 3.6, 3.7 and shipyard's 3.11; the registry above; TF 2.21 installed."""
    monkeypatch.setattr(
        interpreters, "available", lambda: {"3.6": "/py36", "3.7": "/py37", "3.11": "/py311"}
    )
    monkeypatch.setattr(interpreters, "this_python", lambda: "3.11")
    monkeypatch.setattr(interpreters, "find", lambda minor: f"/py{minor.replace('.', '')}")
    monkeypatch.setattr(registry, "fetch_filenames", lambda package, index: WHEELS[package])
    monkeypatch.setattr(job, "installed_version", {"tensorflow": "2.21.0"}.get)
    monkeypatch.delenv("SHIPYARD_FRAMEWORK_EXACT", raising=False)


def test_py36_asked_builds_in_python_3_7_where_the_in_job_parts_run(machine, tmp_path):
    found = job.resolution(job.Request("tensorflow", "1.13", "py36"), str(tmp_path))
    assert (found.version, found.python, found.exact) == ("1.13.2", "3.7", True)


def test_a_release_only_python_3_6_runs_is_refused_naming_the_nearest_that_would(machine, tmp_path):
    with pytest.raises(job.EnvironmentRefused) as refused:
        job.resolution(job.Request("tensorflow", "1.12", "py36"), str(tmp_path))
    said = str(refused.value)
    assert "framework_version '1.12' runs only in Python 3.6 here" in said
    assert "in-job parts" in said and "need Python 3.7 or later" in said
    assert "TensorFlow 1.13.2 is the oldest release there: ask for it" in said


def test_with_no_python_3_6_the_refusal_still_names_the_release_python_3_7_runs(
    machine, monkeypatch, tmp_path
):
    monkeypatch.setattr(interpreters, "available", lambda: {"3.7": "/py37", "3.11": "/py311"})
    with pytest.raises(job.EnvironmentRefused) as refused:
        job.resolution(job.Request("tensorflow", "1.12"), str(tmp_path))
    said = str(refused.value)
    assert "no TensorFlow release of the same API generation" not in said
    assert said.endswith(
        "TensorFlow 1.13.2 (the same API generation) runs here in Python 3.7: ask for "
        "framework_version='1.13'"
    ), said


def test_an_mpi_job_is_refused_naming_mpi4py(machine, tmp_path):
    req = job.request("tensorflow", "1.12", "py36", runner="mpi")
    assert req is not None
    with pytest.raises(job.EnvironmentRefused, match="need mpi4py, which shipyard installs"):
        job.resolution(req, str(tmp_path))
