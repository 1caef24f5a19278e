"""VolumeSizeInGB (issue 37): validated where a job is described, planned against the
host's free space, and read back by describe's protections and the disk-full reason."""

from __future__ import annotations

import json
import os

import pytest

from shipyard.control import disk_full, job_disks
from shipyard.control.job_end import missing_protections
from shipyard.errors import ValidationError
from shipyard.sandbox import disk
from shipyard.spec import validated

GIB = 1 << 30


def _spec(**fields):
    return validated(job_name="v", code={"entry_point": "train.py"}, **fields)


def test_default_is_sagemakers_30():
    assert _spec().volume_size_gb == 30


@pytest.mark.parametrize("ok", [1, 30, 16384])
def test_sagemakers_range_is_taken(ok):
    assert _spec(volume_size_gb=ok).volume_size_gb == ok


@pytest.mark.parametrize(
    "bad, said",
    [
        (0, "between 1 and 16384 GB"),
        (16385, "between 1 and 16384 GB"),
        (-5, "between 1 and 16384 GB"),
        ("big", "whole number of GB"),
        (2.5, "whole number of GB"),
        (True, "whole number of GB"),
    ],
)
def test_a_bad_size_is_one_clear_line(bad, said):
    with pytest.raises(ValidationError) as exc:
        _spec(volume_size_gb=bad)
    text = str(exc.value)
    assert "VolumeSizeInGB" in text and said in text and "\n" not in text


def test_the_estimators_volume_size_reaches_the_spec(tmp_path):
    import shipyard

    session = shipyard.Session(home=str(tmp_path / "home"))
    est = shipyard.Estimator(
        entry_point="train.py",
        instance_count=1,
        instance_type="local",
        volume_size=7,
        session=session,
    )
    assert est._job_spec(None, "v").volume_size_gb == 7
    with pytest.raises(ValidationError, match="volume_size: VolumeSizeInGB must be between"):
        shipyard.Estimator(
            entry_point="train.py",
            instance_count=1,
            instance_type="local",
            volume_size=0,
            session=session,
        )


def test_a_disk_is_what_was_asked_when_the_host_has_room():
    assert disk.disk_size(free=1000 * GIB, size_gb=30, instances=4) == 30 * GIB


def test_a_disk_shrinks_to_its_share_of_the_hosts_free_space():
    # 4 instances asking 30 GB each of a host with 40 GiB free: 90% of it, split in four
    size = disk.disk_size(free=40 * GIB, size_gb=30, instances=4)
    assert size == int(40 * GIB * 0.9) // 4 // (1 << 20) << 20
    assert size < 30 * GIB


def test_a_host_too_full_for_a_disk_is_said():
    with pytest.raises(OSError, match="MiB free, too little for 2 disk"):
        disk.disk_size(free=20 << 20, size_gb=1, instances=2)


def _job(tmp_path, record):
    job_dir = tmp_path / "job"
    (job_dir / "instances" / "algo-1").mkdir(parents=True)
    if record is not None:
        (job_dir / job_disks.RECORD_NAME).write_text(json.dumps(record))
    return str(job_dir)


def test_protections_name_no_disk_when_none_was_planned(tmp_path):
    job_dir = _job(tmp_path, None)
    assert missing_protections(job_dir, ["algo-1"]) == [
        {"Host": "algo-1", "Missing": disk_full.NO_VOLUME}
    ]


def test_protections_leave_the_disk_out_when_it_was_in_place(tmp_path):
    job_dir = _job(tmp_path, {"algo-1": {"SizeInGB": 5, "Bytes": 5 * GIB, "Missing": None}})
    assert missing_protections(job_dir, ["algo-1"]) == []


def test_protections_say_why_an_instance_had_no_disk(tmp_path):
    why = "this machine has no loop devices (/dev/loop-control is missing)"
    job_dir = _job(tmp_path, {"algo-1": {"SizeInGB": 5, "Bytes": None, "Missing": why}})
    [entry] = missing_protections(job_dir, ["algo-1"])
    assert entry["Missing"].startswith(f"no disk of VolumeSizeInGB ({why})")


FULL = "Traceback ...\nOSError: [Errno 28] No space left on device"


def test_a_full_disk_of_its_own_is_named_with_its_size_and_what_filled_it(tmp_path):
    job_dir = _job(tmp_path, {"algo-1": {"SizeInGB": 1, "Bytes": GIB, "Missing": None}})
    tree = os.path.join(job_dir, "instances", "algo-1")
    os.makedirs(os.path.join(tree, "model"))
    with open(os.path.join(tree, "model", "big.bin"), "wb") as fh:
        fh.write(b"x" * (3 << 20))
    os.symlink("/", os.path.join(tree, "model", "root"))  # never walked
    line = disk_full.verdict(FULL, tree)
    assert line is not None
    assert line.startswith("the instance's disk of VolumeSizeInGB (1 GB) under /opt/ml is full")
    assert ": model/ 3.0 MiB;" in line and "VolumeSizeInGB" in line


def test_without_a_disk_the_hosts_filesystem_is_named(tmp_path):
    why = "shipyard runs as a user without root, who cannot attach and mount a disk image"
    job_dir = _job(tmp_path, {"algo-1": {"SizeInGB": 1, "Bytes": None, "Missing": why}})
    line = disk_full.verdict(FULL, os.path.join(job_dir, "instances", "algo-1"))
    assert line is not None and "the host's filesystem mounted at" in line
    assert "not a volume of VolumeSizeInGB" in line


def test_other_failures_get_no_disk_line(tmp_path):
    job_dir = _job(tmp_path, {"algo-1": {"SizeInGB": 1, "Bytes": GIB, "Missing": None}})
    assert (
        disk_full.verdict("ZeroDivisionError", os.path.join(job_dir, "instances", "algo-1")) is None
    )


def test_a_disk_smaller_than_asked_says_so(tmp_path):
    job_dir = _job(tmp_path, {"algo-1": {"SizeInGB": 30, "Bytes": 40 << 20, "Missing": None}})
    line = disk_full.verdict(FULL, os.path.join(job_dir, "instances", "algo-1"))
    assert line is not None and line.startswith(
        "the instance's disk under /opt/ml (40.0 MiB, less than its VolumeSizeInGB of 30 GB: "
        "the host's filesystem had no more free) is full"
    )


def _request(resources):
    return {
        "TrainingJobName": "v",
        "HyperParameters": {"sagemaker_program": '"train.py"'},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, **resources},
    }


def test_the_servers_resource_config_carries_the_size(tmp_path):
    from shipyard.server.training import TrainingApi

    api = TrainingApi(None, None, None, str(tmp_path))  # type: ignore[arg-type]
    spec = api.spec_from_request(_request({"VolumeSizeInGB": 5}), "tensorflow", str(tmp_path))
    assert spec.volume_size_gb == 5
    spec = api.spec_from_request(_request({}), "tensorflow", str(tmp_path))
    assert spec.volume_size_gb == 30
    with pytest.raises(ValidationError, match="VolumeSizeInGB must be between 1 and 16384"):
        api.spec_from_request(_request({"VolumeSizeInGB": 0}), "tensorflow", str(tmp_path))
