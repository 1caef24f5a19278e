"""The dashboard's API over a real job store (no server): the jobs list's Distribution
column, the Environment a job page gets, and the utilization samples it does not."""

from __future__ import annotations

import json

from shipyard.control.client import ControlPlane
from shipyard.dashboard import api, usageread
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


def test_a_job_page_poll_leaves_the_samples_to_their_own_paged_route(tmp_path) -> None:
    control = ControlPlane(str(tmp_path / "home"))
    spec = validated(job_name="job", code={"entry_point": "train.py", "source_dir": "/src"})
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    control.store.create_job(spec, {}, str(job_dir), "local", None)
    sample = {"Timestamp": 1.0, "Host": "algo-1", "Attempt": 1, "CPUUtilization": 50.0}
    (job_dir / usageread.UTILIZATION_NAME).write_text(json.dumps(sample) + "\n")
    assert control.describe("job")["Shipyard"]["Utilization"]  # describe has them ...
    assert "Utilization" not in api.job(control, "job")["Shipyard"]  # ... a poll does not
    page = api.utilization(control, "job")
    assert page["samples"] == [sample] and not page["more"] and not page["terminal"]
    assert api.utilization(control, "job", page["cursor"])["samples"] == []
