"""A PyTorch notebook asking for a torch this machine cannot install (PyTorch's CPU index out
of reach, PyPI's torch a CUDA build of several GB) runs as written on the installed torch of
the same API generation, and says so in the log and describe; SHIPYARD_FRAMEWORK_EXACT=1
turns the substitute into a failure that names why (issue 38). The index is a closed port
on loopback: a real refused connection, as an unreachable index gives."""

from __future__ import annotations

import socket

import pytest

import shipyard
from tests.lazy import needs

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300), needs("torch")]

SCRIPT = "import torch\nprint('torch', torch.__version__, flush=True)\n"


@pytest.fixture
def unreachable_index(monkeypatch):
    with socket.socket() as s:  # bound, never listening: every connect is refused
        s.bind(("127.0.0.1", 0))
        index = f"http://127.0.0.1:{s.getsockname()[1]}/simple"
        monkeypatch.setenv("SHIPYARD_PYTORCH_INDEX_URL", index)
        monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)
        yield index


def _estimator(session, write_script):
    return shipyard.PyTorch(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=1,
        instance_type="local",
        framework_version="2.1",
        py_version="py310",
        session=session,
    )


def test_a_notebooks_torch_2_1_runs_on_the_installed_torch_and_says_so(
    session, write_script, unreachable_index, monkeypatch, capsys
):
    from importlib.metadata import version

    monkeypatch.delenv("SHIPYARD_FRAMEWORK_EXACT", raising=False)
    est = _estimator(session, write_script)
    est.fit(job_name="torch-2-1-on-installed")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    installed = version("torch").split("+")[0]
    env = desc["Shipyard"]["FrameworkEnvironment"]
    assert (env["Asked"], env["Version"], env["Exact"]) == ("2.1", installed, False)
    assert f"the registry at {unreachable_index} could not be reached" in env["Note"]
    out, _ = capsys.readouterr()
    assert f"running PyTorch {installed}, the nearest with the same API generation" in out
    assert f"torch {version('torch')}" in out


def test_the_exactness_setting_fails_the_job_naming_why(
    session, write_script, unreachable_index, monkeypatch
):
    from shipyard.errors import JobFailedError

    monkeypatch.setenv("SHIPYARD_FRAMEWORK_EXACT", "1")
    est = _estimator(session, write_script)
    with pytest.raises(JobFailedError):
        est.fit(job_name="torch-2-1-exact")
    reason = est.latest_training_job.describe()["FailureReason"]
    assert "framework_version '2.1'" in reason
    assert "SHIPYARD_FRAMEWORK_EXACT=1 runs only the version asked for" in reason
