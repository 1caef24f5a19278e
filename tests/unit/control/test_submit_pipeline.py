"""ControlPlane.submit as a pipeline with one rollback, without starting a process: a
submit that fails (or is interrupted) after the name's reservation leaves no record, no
job directory and no staged code, and the name is free again."""

from __future__ import annotations

import os
import stat

import pytest

from shipyard.control import plan, staging
from shipyard.control.client import ControlPlane
from shipyard.errors import JobExistsError
from shipyard.spec import validated


def _spec(tmp_path, name: str = "job-1"):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text("print('hi')\n")
    return validated(
        job_name=name,
        code={"entry_point": "train.py", "source_dir": str(src)},
        instance_count=2,
        output_path=str(tmp_path / "out"),
    )


def _left(control: ControlPlane, name: str) -> list[str]:
    left = []
    if control.store.exists(name):
        left.append("record")
    if os.path.exists(control.home.job_dir(name)):
        left.append("job directory")
    return left


def test_a_submit_writes_the_job_and_its_secret_owner_only(tmp_path) -> None:
    control = ControlPlane(str(tmp_path / "home"))
    record = control.submit(_spec(tmp_path))
    job_dir = control.home.job_dir("job-1")
    assert record.name == "job-1" and record.subnet is not None
    for name in ("job.json", "agent.json", "logs"):
        assert os.path.exists(os.path.join(job_dir, name)), name
    assert stat.S_IMODE(os.stat(os.path.join(job_dir, "agent.json")).st_mode) == 0o600


@pytest.mark.parametrize("error", [RuntimeError("disk gone"), KeyboardInterrupt()])
def test_a_failure_after_the_reservation_is_undone_as_a_whole(tmp_path, monkeypatch, error):
    control = ControlPlane(str(tmp_path / "home"))
    discarded = []
    real_discard = staging.discard
    monkeypatch.setattr(staging, "discard", lambda s: (discarded.append(s), real_discard(s)))

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(plan, "agent_config", broken)
    with pytest.raises(type(error)):
        control.submit(_spec(tmp_path))
    assert _left(control, "job-1") == []
    assert len(discarded) == 1  # the staged code went too
    monkeypatch.undo()
    assert control.submit(_spec(tmp_path)).name == "job-1"  # the name is free again


def test_a_failure_while_staging_leaves_nothing(tmp_path, monkeypatch) -> None:
    control = ControlPlane(str(tmp_path / "home"))

    def broken(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(staging, "stage", broken)
    with pytest.raises(OSError):
        control.submit(_spec(tmp_path))
    assert _left(control, "job-1") == []


def test_refusals_before_the_reservation_write_nothing(tmp_path) -> None:
    control = ControlPlane(str(tmp_path / "home"))
    control.submit(_spec(tmp_path))
    with pytest.raises(JobExistsError, match="already exists"):
        control.submit(_spec(tmp_path))
    bad = _spec(tmp_path, "job-2").model_copy(update={"output_path": "s3://no-such-bucket/x"})
    with pytest.raises(Exception, match="output_path"):
        control.submit(bad)
    assert _left(control, "job-2") == []


def test_a_directory_left_by_an_older_job_is_not_reused(tmp_path) -> None:
    control = ControlPlane(str(tmp_path / "home"))
    os.makedirs(control.home.job_dir("job-1"))
    with pytest.raises(JobExistsError, match="directory"):
        control.submit(_spec(tmp_path))
    assert not control.store.exists("job-1")
