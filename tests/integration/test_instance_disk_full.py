"""Issue 37: a job that fills the disk under its /opt/ml gets a FailureReason naming the disk.

``shipyard train`` runs in a private mount namespace whose SHIPYARD_HOME is a 48 MiB tmpfs,
so the instance's /opt/ml is on a small, real filesystem; the script writes until the
kernel answers ENOSPC, removes what it wrote (as a checkpoint writer cleans up) and
fails. Before, the reason was the bare traceback's ``OSError: [Errno 28] No space left on
device``. Now, as root, the instance has its own disk (shipyard.sandbox.disk), smaller
than the 30 GB asked since the home has 48 MiB: the first line names that disk, says it
is smaller than VolumeSizeInGB and why, and algo-1's log said so at the start. Where no
disk can be made (``mkfs.ext4`` fails here), the job still runs on the host's filesystem:
the first line names that filesystem, its mount point and what is free on it, and
describe's protections and algo-1's log name the missing disk with why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shipyard.sandbox import disk
from tests.integration.test_artifact_disk_full import _can_mount_tmpfs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

FILL = """
import os
path = os.path.join(os.environ["SM_MODEL_DIR"], "huge.bin")
try:
    with open(path, "wb") as fh:
        while True:
            fh.write(b"\\0" * (1 << 20))
            fh.flush()
except OSError:
    os.remove(path)
    raise
"""

IN_NAMESPACE = """
set -e
mount -t tmpfs -o size=48m,mode=0700 shipyard-test-home "$SHIPYARD_HOME"
if [ -n "$NO_MKFS" ]; then mount --bind /bin/false "$(command -v mkfs.ext4)"; fi
"$PY" -m shipyard.cli train fill.py --source-dir "$SRC" --job-name fill --max-run 300 \\
    >"$LOG" 2>&1 || true
"$PY" -m shipyard.cli describe fill --json >"$DESCRIBED"
"""


def _fill(tmp_path, no_mkfs: bool) -> tuple[dict, str, str]:
    """Run the filling job; describe's answer, algo-1's log and the home's path."""
    why = _can_mount_tmpfs()
    if why:
        pytest.skip(why)
    src = tmp_path / "src"
    src.mkdir()
    (src / "fill.py").write_text(FILL)
    home = tmp_path / "home"
    home.mkdir()
    described = tmp_path / "describe.json"
    env = dict(
        os.environ,
        SHIPYARD_HOME=str(home),
        PYTHONPATH=os.path.join(ROOT, "src"),
        PY=sys.executable,
        SRC=str(src),
        LOG=str(tmp_path / "cli.log"),
        DESCRIBED=str(described),
        NO_MKFS="1" if no_mkfs else "",
    )
    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", IN_NAMESPACE],
        env=env,
        check=True,
        timeout=280,
    )
    job = json.loads(described.read_text())
    return job, (tmp_path / "cli.log").read_text(), str(home)


@pytest.mark.timeout(300)
def test_a_job_filling_its_disk_is_told_which_disk(tmp_path):
    if disk.missing_reason():
        pytest.skip(f"no disks here: {disk.missing_reason()}")
    job, log, _home = _fill(tmp_path, no_mkfs=False)
    assert job["TrainingJobStatus"] == "Failed", job
    reason = job["FailureReason"]
    first = reason.splitlines()[0]
    assert first.startswith("[algo-1] the instance's disk under /opt/ml ("), reason
    assert (
        "less than its VolumeSizeInGB of 30 GB: the host's filesystem had no more free) is full"
        in first
    ), reason
    assert "No space left on device" in reason  # the script's own error follows
    assert "the disk of algo-1 is 0.04 GiB, not 30 GB" in log, log
    missing = [m["Missing"] for m in job["Shipyard"]["MissingProtections"]]
    assert not any("VolumeSizeInGB" in m for m in missing), missing


@pytest.mark.timeout(300)
def test_without_a_disk_the_hosts_filesystem_is_named(tmp_path):
    job, log, home = _fill(tmp_path, no_mkfs=True)
    assert job["TrainingJobStatus"] == "Failed", job
    reason = job["FailureReason"]
    first = reason.splitlines()[0]
    assert first.startswith("[algo-1] the disk under the instance's /opt/ml is full"), reason
    assert f"the host's filesystem mounted at {home}" in first, reason
    assert "not a volume of VolumeSizeInGB" in first and "free of 48.0 MiB" in first, reason
    assert "No space left on device" in reason  # the script's own error follows
    missing = [m["Missing"] for m in job["Shipyard"]["MissingProtections"]]
    said = [m for m in missing if m.startswith("no disk of VolumeSizeInGB (")]
    assert len(said) == 1 and ("mkfs.ext4 failed" in said[0] or disk.missing_reason()), missing
    assert "[shipyard] algo-1: protection missing: no disk of VolumeSizeInGB (" in log, log
