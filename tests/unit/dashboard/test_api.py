"""The dashboard's API over a real job store (no server): the jobs list's Distribution
column and the Environment a job page gets."""

from __future__ import annotations

from shipyard.control.client import ControlPlane
from shipyard.dashboard import api
from shipyard.spec import validated


def _record(control: ControlPlane, name: str, distribution: dict) -> None:
    spec = validated(
        job_name=name,
        code={"entry_point": "train.py", "source_dir": "/src"},
        instance_count=2,
        distribution=distribution,
        environment={"API_KEY": "s3cret"},
    )
    control.store.create_job(spec, {}, f"/jobs/{name}", "local", None)


def test_distribution_column_names_each_jobs_distribution(tmp_path) -> None:
    control = ControlPlane(str(tmp_path))
    _record(control, "ddp", {"kind": "torch_distributed", "options": {}})
    _record(control, "ps", {"kind": "parameter_server", "options": {}})
    _record(control, "plain", {})
    shown = {j["TrainingJobName"]: j["Distribution"] for j in api.jobs(control)}
    assert shown == {"ddp": "torch_distributed", "ps": "parameter_server", "plain": None}


def test_environment_values_only_when_asked_for(tmp_path) -> None:
    control = ControlPlane(str(tmp_path))
    _record(control, "job", {})
    assert api.job(control, "job")["Environment"] == {"API_KEY": api.HIDDEN}
    assert api.job(control, "job", environment=True)["Environment"] == {"API_KEY": "s3cret"}
