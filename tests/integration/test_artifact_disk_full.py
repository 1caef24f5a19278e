"""Issue 37: a disk that fills while model.tar.gz is written is one line, never a traceback.

``shipyard train`` runs in a private mount namespace where the output path is a 2 MiB
tmpfs; the job saves 8 MiB of random bytes (gzip cannot shrink them), so writing
model.tar.gz hits a real ENOSPC. Before the fix the CLI printed ``InternalServerError:
OSError: [Errno 28]`` under a 180-line traceback; now the FailureReason and the CLI say
which file, how much was written and what is free, and the output path holds no partial
archive (listed inside the namespace, before the tmpfs goes away with it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

TRAIN = """
import os
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.bin"), "wb") as fh:
    fh.write(os.urandom(8 << 20))
print("saved", flush=True)
"""

IN_NAMESPACE = """
set -e
mount -t tmpfs -o size=2m shipyard-test-full "$OUT"
rc=0
"$PY" -m shipyard.cli train train.py --source-dir "$SRC" --job-name full-disk \\
    --output-path "file://$OUT" --max-run 300 >"$LOG" 2>&1 || rc=$?
echo "exit=$rc" >>"$LOG"
find "$OUT" -mindepth 1 >"$LISTING"
"""


def _can_mount_tmpfs() -> str | None:
    """Why this machine cannot run the test (None when it can)."""
    if shutil.which("unshare") is None:
        return "util-linux unshare is not installed"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "x", "/mnt"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"no private tmpfs mount here: {probe.stderr}"


@pytest.mark.timeout(300)
def test_full_disk_while_packing_is_one_line_and_leaves_nothing(tmp_path):
    why = _can_mount_tmpfs()
    if why:
        pytest.skip(why)
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    log, listing = tmp_path / "cli.log", tmp_path / "listing.txt"
    env = dict(
        os.environ,
        SHIPYARD_HOME=str(home),
        PYTHONPATH=os.path.join(ROOT, "src"),
        PY=sys.executable,
        SRC=str(src),
        OUT=str(out),
        LOG=str(log),
        LISTING=str(listing),
    )
    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", IN_NAMESPACE],
        env=env,
        check=True,
        timeout=280,
    )
    text = log.read_text(errors="replace")
    assert "exit=0" not in text, text
    assert "Traceback" not in text, text
    assert "OSError" not in text and "InternalServerError" not in text, text
    assert "no space left on device writing " + str(out) in text, text
    assert listing.read_text() == "" or all(
        not os.path.basename(p).startswith(".shipyard-partial-") and not p.endswith("model.tar.gz")
        for p in listing.read_text().split()
    ), listing.read_text()

    described = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "describe", "full-disk", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    job = json.loads(described)
    assert job["TrainingJobStatus"] == "Failed"
    reason = job["FailureReason"]
    assert "\n" not in reason and "Traceback" not in reason, reason
    assert f"no space left on device writing {out}/full-disk/output/model.tar.gz" in reason
    assert "MiB" in reason and "free" in reason, reason
