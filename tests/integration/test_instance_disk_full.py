"""Issue 37: a job that fills the disk under its /opt/ml gets a FailureReason naming the disk,
and describe's protections say the instance has no disk of VolumeSizeInGB.

``shipyard train`` runs in a private mount namespace whose SHIPYARD_HOME is a 48 MiB tmpfs,
so the instance's /opt/ml (its tree under the home) is on a small, real filesystem; the
script writes until the kernel answers ENOSPC, removes what it wrote (as a checkpoint
writer cleans up) and fails. Before, the reason was the bare traceback's
``OSError: [Errno 28] No space left on device``; now its first line names the filesystem,
its mount point and what is free on it, and that it is not a volume of VolumeSizeInGB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shipyard.control.disk_full import NO_VOLUME
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
"$PY" -m shipyard.cli train fill.py --source-dir "$SRC" --job-name fill --max-run 300 \\
    >"$LOG" 2>&1 || true
"$PY" -m shipyard.cli describe fill --json >"$DESCRIBED"
"""


@pytest.mark.timeout(300)
def test_a_job_filling_its_disk_is_told_which_disk(tmp_path):
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
    )
    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", IN_NAMESPACE],
        env=env,
        check=True,
        timeout=280,
    )
    job = json.loads(described.read_text())
    assert job["TrainingJobStatus"] == "Failed", job
    reason = job["FailureReason"]
    first = reason.splitlines()[0]
    assert first.startswith("[algo-1] the disk under the instance's /opt/ml is full"), reason
    assert f"the host's filesystem mounted at {home}" in first, reason
    assert "not a volume of VolumeSizeInGB" in first and "free of 48.0 MiB" in first, reason
    assert "No space left on device" in reason  # the script's own error follows
    assert {"Host": "algo-1", "Missing": NO_VOLUME} in job["Shipyard"]["MissingProtections"]
