"""What submission decides about a job's framework environment, with no registry query:
nothing asked or the installed version asked -> the installed environment; another version
-> a request the job's first phase prepares; SHIPYARD_FRAMEWORK_ENVS=off -> never."""

from __future__ import annotations

import pytest

from shipyard.environments import job
from shipyard.errors import SettingError


@pytest.fixture
def installed(monkeypatch):
    versions = {"tensorflow": "2.21.0", "pytorch": "2.13.0+cpu"}
    monkeypatch.setattr(job, "installed_version", versions.get)


@pytest.mark.parametrize("value", [None, "auto", "on"])
def test_another_version_asked_is_a_request_by_default(installed, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(job.SWITCH, raising=False)
    else:
        monkeypatch.setenv(job.SWITCH, value)
    assert job.request("tensorflow", "2.4.1", "py37") == job.Request("tensorflow", "2.4.1", "py37")
    assert job.request("pytorch", "2.3.0") == job.Request("pytorch", "2.3.0")


@pytest.mark.parametrize(
    ("framework", "version"),
    [
        ("tensorflow", None),
        ("tensorflow", "2.21"),
        ("tensorflow", "2.21.0"),
        ("pytorch", "2.13"),
        (None, "2.4.1"),
        ("xgboost", "1.7"),
    ],
)
def test_nothing_or_the_installed_version_asked_needs_nothing(installed, framework, version):
    assert job.request(framework, version) is None


def test_off_runs_every_job_on_the_installed_framework(installed, monkeypatch):
    monkeypatch.setenv(job.SWITCH, "off")
    assert job.request("tensorflow", "2.4.1") is None


def test_a_bad_switch_value_says_what_it_accepts(installed, monkeypatch):
    monkeypatch.setenv(job.SWITCH, "sometimes")
    with pytest.raises(SettingError, match="auto.*off.*on"):
        job.request("tensorflow", "2.4.1")


def test_the_request_round_trips_through_the_job_directory():
    req = job.Request("tensorflow", "2.4.1", "py37")
    assert job.Request.from_json(req.to_json()) == req
    assert req.describe()["Asked"] == "2.4.1" and req.describe()["Version"] is None


def test_the_cache_is_the_homes_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv(job.DIR_SETTING, raising=False)
    assert job.root("/h") == "/h/environments"
    monkeypatch.setenv(job.DIR_SETTING, str(tmp_path))
    assert job.root("/h") == str(tmp_path)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound, never listening: a connect is refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pytorch_out_of_its_index_reach_runs_the_installed_torch_and_says_why(
    installed, monkeypatch, tmp_path
):
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    monkeypatch.setenv("SHIPYARD_PYTORCH_INDEX_URL", index)
    monkeypatch.delenv("SHIPYARD_FRAMEWORK_EXACT", raising=False)
    found = job.resolution(job.Request("pytorch", "2.1"), str(tmp_path))
    assert (found.version, found.installed, found.exact) == ("2.13.0", True, False)
    assert (
        found.reason is not None and f"the registry at {index} could not be reached" in found.reason
    )
    assert "running PyTorch 2.13.0" in found.reason


def test_the_exactness_setting_refuses_any_substitute(installed, monkeypatch, tmp_path):
    monkeypatch.setenv("SHIPYARD_PYTORCH_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_EXACT", "1")
    with pytest.raises(job.EnvironmentRefused, match="SHIPYARD_FRAMEWORK_EXACT=1 runs only"):
        job.resolution(job.Request("pytorch", "2.1"), str(tmp_path))


def test_a_job_whose_runner_needs_mpi4py_asks_for_python_3_7_or_newer(installed):
    assert job.request("tensorflow", "2.4.1", "py37", runner="mpi").min_python == "3.7"
    assert job.request("tensorflow", "2.4.1", "py37", runner="plain").min_python is None
    back = job.Request.from_json(job.request("tensorflow", "2.4.1", runner="mpi").to_json())
    assert back.min_python == "3.7"


def test_in_python_3_7_mpi4py_is_built_from_source_and_part_of_the_key():
    from shipyard.environments import builder

    pins = job._pinned("3.7")
    assert builder.MPI4PY_SOURCE in pins and not any(p.startswith("mpi4py==") for p in pins)
    assert builder.MPI4PY_SOURCE not in job._pinned("3.8") + job._pinned(None)
