"""File and FastFile channels from the loopback S3 server and from local directories."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile

import pytest

import shipyard

SCRIPT = r"""
import hashlib, json, os, time
started = time.time()
out = {}
for ch in ("s3file", "s3fast", "localfile", "localfast"):
    root = os.environ["SM_CHANNEL_" + ch.upper()]
    files = {}
    for dirpath, _, names in os.walk(root, followlinks=True):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), root)
            if ch == "s3fast" and not rel.startswith("read/"):
                files[rel] = os.path.getsize(os.path.join(dirpath, n))  # listed, not read
                continue
            with open(os.path.join(dirpath, n), "rb") as fh:
                files[rel] = hashlib.sha256(fh.read()).hexdigest()
    out[ch] = files
out["modes"] = {k: v["TrainingInputMode"] for k, v in
                json.loads(os.environ["SM_INPUT_DATA_CONFIG"]).items()}
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "seen.json"), "w") as fh:
    json.dump(out, fh)
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.timeout(120)
def test_file_and_fastfile_from_s3_and_local(session, write_script, bucket, tmp_path):
    blobs = {f"data/train/part-{i}.bin": os.urandom(1000 + i) for i in range(3)}
    blobs["data/train/sub/deep.bin"] = os.urandom(77)
    for key, data in blobs.items():
        bucket.put(key, data)
    fast = {"fast/read/a.bin": os.urandom(3 << 20), "fast/skip/big.bin": os.urandom(5 << 20)}
    for key, data in fast.items():
        bucket.put(key, data)
    local = tmp_path / "local"
    (local / "nested").mkdir(parents=True)
    (local / "x.txt").write_text("x" * 10)
    (local / "nested" / "y.txt").write_text("y")

    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(
        {
            "s3file": bucket.uri("data/train"),
            "s3fast": shipyard.TrainingInput(bucket.uri("fast/"), input_mode="FastFile"),
            "localfile": str(local),
            "localfast": shipyard.TrainingInput("file://" + str(local), input_mode="FastFile"),
        },
        job_name="file-modes",
    )
    desc = est.latest_training_job.describe()
    with tarfile.open(desc["Shipyard"]["OutputArtifacts"].removeprefix("file://")) as tar:
        seen = json.load(tar.extractfile("seen.json"))

    assert seen["s3file"] == {k.removeprefix("data/train/"): sha(v) for k, v in blobs.items()}
    assert seen["s3fast"] == {"read/a.bin": sha(fast["fast/read/a.bin"]), "skip/big.bin": 5 << 20}
    local_expected = {"x.txt": sha(b"x" * 10), "nested/y.txt": sha(b"y")}
    assert seen["localfile"] == local_expected and seen["localfast"] == local_expected
    assert seen["modes"] == {
        "s3file": "File",
        "s3fast": "FastFile",
        "localfile": "File",
        "localfast": "FastFile",
    }
    with open(os.path.join(session.home, "jobs", "file-modes", "logs", "algo-1.log")) as fh:
        log = fh.read()
    # FastFile fetched only what the script read: one of the two objects, not the 5 MiB one
    assert "channel s3fast (FastFile): read 1 of 2 objects, fetched 3.1 MB" in log, log[-3000:]
    assert "channel s3file (File) from s3://" in log  # progress line
