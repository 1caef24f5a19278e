"""Issue 37: each instance's /opt/ml is a disk of VolumeSizeInGB (shipyard.sandbox.disk).

Real jobs on the local backend, as root: a job writing past its 1 GB disk fails with a
reason naming the disk, a job within it succeeds with its model uploaded and kept, and
no end (failure, success, a stop, an agent killed with SIGKILL) leaves the job's loop
device, mount or image behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time

import psutil
import pytest

import shipyard
from shipyard.control.disk_full import NO_VOLUME
from shipyard.errors import JobFailedError
from shipyard.sandbox import disk

pytestmark = pytest.mark.skipif(
    disk.missing_reason() is not None, reason=f"no disks here: {disk.missing_reason()}"
)

WRITE = """
import os, sys
mb = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ["WRITE_MB"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.bin"), "wb") as fh:
    for _ in range(mb):
        fh.write(b"\\1" * (1 << 20))
    fh.flush()
    os.fsync(fh.fileno())
st = os.statvfs("/opt/ml")
print("opt-ml-size", st.f_blocks * st.f_frsize, flush=True)
"""


def _leftovers(job_dir: str) -> dict[str, list[str]]:
    """The job's own loop devices, mounts and images (other jobs' are not counted)."""
    return {
        "loops": [f for f in disk.loop_backing_files() if f.startswith(job_dir)],
        "mounts": [m for m in disk.mount_points() if m.startswith(job_dir)],
        "images": [
            f
            for f in os.listdir(os.path.join(job_dir, disk.DISKS_DIR))
            if os.path.isdir(os.path.join(job_dir, disk.DISKS_DIR))
        ]
        if os.path.isdir(os.path.join(job_dir, disk.DISKS_DIR))
        else [],
    }


NONE_LEFT = {"loops": [], "mounts": [], "images": []}


def _left_after_a_while(job_dir: str) -> dict[str, list[str]]:
    """The leftovers once the kernel is done: a loop device is freed when the last mount
    namespace holding its file system is gone (the job network's holder, an instance's
    init may end a moment after the job), asynchronously."""
    deadline = time.monotonic() + 60
    left = _leftovers(job_dir)
    while left != NONE_LEFT and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _leftovers(job_dir)
    return left


def _estimator(session, src, size, mb, **kw):
    return shipyard.Estimator(
        entry_point="write.py",
        source_dir=src,
        instance_count=kw.pop("instance_count", 1),
        instance_type="local",
        volume_size=size,
        environment={"WRITE_MB": str(mb)},
        session=session,
        **kw,
    )


@pytest.mark.timeout(600)
def test_writing_past_the_disk_fails_naming_it(session, write_script):
    src = write_script("write.py", WRITE)
    est = _estimator(session, src, size=1, mb=1229)  # 1.2 GB on a 1 GB disk
    with pytest.raises(JobFailedError):
        est.fit(job_name="past-disk")
    desc = est.latest_training_job.describe()
    reason = desc["FailureReason"]
    first = reason.splitlines()[0]
    assert first.startswith(
        "[algo-1] the instance's disk of VolumeSizeInGB (1 GB) under /opt/ml is full: model/ "
    ), reason
    assert "No space left on device" in reason  # the script's own error follows
    assert desc["ResourceConfig"]["VolumeSizeInGB"] == 1
    missing = [m["Missing"] for m in desc["Shipyard"]["MissingProtections"]]
    assert NO_VOLUME not in missing and not any("VolumeSizeInGB" in m for m in missing)
    assert _left_after_a_while(desc["Shipyard"]["JobDir"]) == NONE_LEFT


@pytest.mark.timeout(600)
def test_a_job_within_its_disk_succeeds_and_its_model_is_kept(session, write_script, tmp_path):
    src = write_script("write.py", WRITE)
    out = tmp_path / "out"
    est = _estimator(session, src, size=1, mb=64, instance_count=2, output_path=str(out))
    est.fit(job_name="within-disk")
    desc = est.latest_training_job.describe()
    job_dir = desc["Shipyard"]["JobDir"]
    with open(os.path.join(job_dir, "logs", "algo-1.log"), encoding="utf-8") as fh:
        log = fh.read()
    assert "/opt/ml of each instance is a disk of 1 GB (VolumeSizeInGB)" in log
    sizes = [int(line.split()[1]) for line in log.splitlines() if line.startswith("opt-ml-size")]
    assert sizes and all(0.9 * (1 << 30) < s <= (1 << 30) for s in sizes), sizes
    with tarfile.open(out / "within-disk" / "output" / "model.tar.gz") as tar:
        assert tar.getmember("weights.bin").size == 64 << 20
    for host in ("algo-1", "algo-2"):  # kept on the host after the disk is gone
        kept = os.path.join(job_dir, "instances", host, "model", "weights.bin")
        assert os.path.getsize(kept) == 64 << 20
        config = os.path.join(job_dir, "instances", host, "input", "config")
        assert os.path.isfile(os.path.join(config, "resourceconfig.json"))  # the contract
    assert not any("VolumeSizeInGB" in m["Missing"] for m in desc["Shipyard"]["MissingProtections"])
    assert _left_after_a_while(job_dir) == NONE_LEFT


SLEEP = """
import os, time
open(os.path.join(os.environ["SM_MODEL_DIR"], "started"), "w").close()
time.sleep(600)
"""


def _started(session, write_script, name):
    src = write_script("sleep.py", SLEEP)
    est = shipyard.Estimator(
        entry_point="sleep.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        volume_size=2,
        session=session,
    )
    est.fit(job_name=name, wait=False)
    job = session.control.get(name)
    mark = os.path.join(job.job_dir, "instances", "algo-1", "model", "started")
    deadline = time.monotonic() + 240
    while not os.path.exists(mark):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    assert _leftovers(job.job_dir)["mounts"], "the disk is mounted while the job runs"
    return est, job.job_dir


def _ended(session, name):
    deadline = time.monotonic() + 240
    while not session.control.get(name).terminal:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.2)
    return session.control.get(name)


@pytest.mark.timeout(600)
def test_a_stopped_job_leaves_no_disk(session, write_script):
    est, job_dir = _started(session, write_script, "stopped-disk")
    est.latest_training_job.stop()
    record = _ended(session, "stopped-disk")
    assert record.status.value == "Stopped", record.status
    assert _left_after_a_while(job_dir) == NONE_LEFT
    assert os.path.exists(os.path.join(job_dir, "instances", "algo-1", "model", "started"))


@pytest.mark.timeout(600)
def test_an_agent_killed_with_sigkill_leaves_no_disk(session, write_script):
    _est, job_dir = _started(session, write_script, "killed-disk")
    agents = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "shipyard.agent" in " ".join(p.info["cmdline"] or [])
        and os.path.join(job_dir, "agent.json") in " ".join(p.info["cmdline"] or [])
    ]
    assert agents, "no agent found"
    for agent in agents:
        os.kill(agent.pid, signal.SIGKILL)
    record = _ended(session, "killed-disk")
    assert record.status.value == "Failed", record.status
    assert _left_after_a_while(job_dir) == NONE_LEFT


@pytest.mark.timeout(600)
def test_a_job_s_disk_goes_while_a_later_job_still_runs(session, write_script):
    """A later job's instances copy the host's mounts, the earlier job's disk among them:
    they let it go, so the earlier job's end frees its loop device and image at once."""
    first, first_dir = _started(session, write_script, "earlier-disk")
    later, later_dir = _started(session, write_script, "later-disk")
    first.latest_training_job.stop()
    assert _ended(session, "earlier-disk").status.value == "Stopped"
    assert _left_after_a_while(first_dir) == NONE_LEFT
    assert not session.control.get("later-disk").terminal  # it held no copy
    later.latest_training_job.stop()
    _ended(session, "later-disk")
    assert _left_after_a_while(later_dir) == NONE_LEFT


@pytest.mark.timeout(600)
def test_a_supervisor_killed_with_sigkill_leaves_no_disk(write_script, home):
    """The supervisor's disk reaper (a shell holding a pipe from it) releases the disks
    when the supervisor dies without doing it: what the host keeps of the tree stays."""
    src = write_script("sleep.py", SLEEP)
    code = (
        "import shipyard\n"
        f"e = shipyard.Estimator(entry_point='sleep.py', source_dir={src!r}, "
        "instance_count=1, instance_type='local', volume_size=2)\n"
        "e.fit(job_name='killed-supervisor')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    job_dir = os.path.join(str(home), "jobs", "killed-supervisor")
    mark = os.path.join(job_dir, "instances", "algo-1", "model", "started")
    deadline = time.monotonic() + 240
    try:
        while not os.path.exists(mark):
            assert time.monotonic() < deadline, "the job did not start"
            assert proc.poll() is None, "the job's process ended"
            time.sleep(0.2)
        assert _leftovers(job_dir)["mounts"], "the disk is mounted while the job runs"
    finally:
        proc.kill()
        proc.wait()
    assert _left_after_a_while(job_dir) == NONE_LEFT
    assert os.path.exists(mark)  # model/ kept on the host


def test_a_tree_that_is_a_link_gets_no_disk_and_nothing_is_left(tmp_path):
    """The disk is mounted through an fd of the tree opened without following a link:
    a link at the tree's name (never there unless planted) is refused, not followed."""
    job_dir = tmp_path / "job"
    (job_dir / "instances").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, job_dir / "instances" / "algo-1")
    made = disk.create_all(str(job_dir), ["algo-1"], 1)
    assert isinstance(made["algo-1"], str) and "could not be made" in made["algo-1"]
    assert not [m for m in disk.mount_points() if m.startswith(str(tmp_path))]
    assert os.listdir(job_dir / disk.DISKS_DIR) == []
    assert _left_after_a_while(str(job_dir)) == NONE_LEFT


def _release_seeing_the_image(monkeypatch, tmp_path, mb: int) -> tuple[int, str, dict]:
    """One disk with ``mb`` MiB in model/, released; returns the bytes the image held
    when it was deleted, the kept file's path and the leftovers."""
    job_dir = str(tmp_path / "job")
    made = disk.create_all(job_dir, ["algo-1"], 1)
    d = made["algo-1"]
    assert isinstance(d, disk.Disk), d
    os.makedirs(os.path.join(d.tree, "model"))
    with open(os.path.join(d.tree, "model", "weights.bin"), "wb") as fh:
        for i in range(mb):
            fh.write(bytes([i % 251 + 1]) * (1 << 20))  # dirty in the page cache
    held: list[int] = []
    real_unlink = disk._unlink

    def unlink(path: str) -> None:
        if path == d.image:
            held.append(os.stat(path).st_blocks * 512)
        real_unlink(path)

    monkeypatch.setattr(disk, "_unlink", unlink)
    assert disk.release(d, job_dir) is None
    assert len(held) == 1
    return held[0], os.path.join(d.tree, "model", "weights.bin"), _leftovers(job_dir)


def test_a_released_disk_does_not_write_its_data_into_the_image_it_deletes(monkeypatch, tmp_path):
    """Once model/, output/, agent/ and input/config/ are copied off, what the job wrote
    and the page cache still holds is not written through the loop device into the
    image (deleted right after): the image holds little more than what mkfs wrote, and
    the copy is whole."""
    mb = 32
    held, kept, left = _release_seeing_the_image(monkeypatch, tmp_path, mb)
    assert held < 8 << 20, f"the image took {held >> 20} MiB of the job's data"
    assert os.path.getsize(kept) == mb << 20
    with open(kept, "rb") as fh:
        for i in range(mb):
            assert fh.read(1 << 20) == bytes([i % 251 + 1]) * (1 << 20), f"MiB {i} differs"
    assert left == NONE_LEFT


def test_a_disk_whose_copy_failed_keeps_a_whole_image(monkeypatch, tmp_path):
    """When the parts could not be copied off, the image is kept for the user to mount:
    its file system must then have everything the job wrote (no shutdown)."""

    def refuse(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk, "_copy_parts", refuse)
    job_dir = str(tmp_path / "job")
    d = disk.create_all(job_dir, ["algo-1"], 1)["algo-1"]
    assert isinstance(d, disk.Disk), d
    os.makedirs(os.path.join(d.tree, "model"))
    with open(os.path.join(d.tree, "model", "weights.bin"), "wb") as fh:
        fh.write(b"\2" * (4 << 20))
    note = disk.release(d, job_dir)
    assert note is not None and d.image in note
    try:
        probe = tmp_path / "probe"
        probe.mkdir()
        subprocess.run(["mount", "-o", "loop,ro", d.image, str(probe)], check=True)
        try:
            with open(probe / "model" / "weights.bin", "rb") as fh:
                assert fh.read() == b"\2" * (4 << 20)
        finally:
            subprocess.run(["umount", str(probe)], check=True)
    finally:
        os.unlink(d.image)
