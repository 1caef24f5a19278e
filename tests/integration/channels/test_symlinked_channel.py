"""A local channel given through a symlink (a notebook's ``fit({"training": "data"})`` where
``data`` links to the real directory) holds its files inside the instance, whole and as
shards (issue 38: the channel linked the unresolved path, which the instance's view does not
hold: its /tmp is private, so the script saw an empty channel and FileNotFoundError)."""

from __future__ import annotations

import json
import os

import pytest

import shipyard

SCRIPT = r"""
import json, os
seen = {}
for ch in ("whole", "shard"):
    root = os.environ["SM_CHANNEL_" + ch.upper()]
    seen[ch] = sorted(
        os.path.relpath(os.path.join(d, n), root)
        for d, _, names in os.walk(root, followlinks=True) for n in names
    )
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "seen.json"), "w") as fh:
    json.dump(seen, fh)
with open(os.path.join(os.environ["SM_CHANNEL_WHOLE"], "a.txt")) as fh:
    print("read", fh.read(), flush=True)
"""


@pytest.mark.timeout(180)
def test_a_channel_through_a_symlink_is_seen_in_the_instance(session, write_script, tmp_path):
    real = tmp_path / "datasets" / "real"
    real.mkdir(parents=True)
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (real / name).write_text(name)
    link = tmp_path / "data"
    link.symlink_to(real, target_is_directory=True)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=2,
        instance_type="local",
        session=session,
    )
    est.fit(
        {
            "whole": str(link),
            "shard": shipyard.TrainingInput(str(link), distribution="ShardedByS3Key"),
        },
        job_name="symlinked-channel",
    )
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    job_dir = desc["Shipyard"]["JobDir"]
    seen = {}
    for host in ("algo-1", "algo-2"):
        path = os.path.join(job_dir, "instances", host, "output", "data", "seen.json")
        with open(path) as fh:
            seen[host] = json.load(fh)
    for host in seen:
        assert seen[host]["whole"] == ["a.txt", "b.txt", "c.txt", "d.txt"], seen
    shards = seen["algo-1"]["shard"] + seen["algo-2"]["shard"]
    assert sorted(shards) == ["a.txt", "b.txt", "c.txt", "d.txt"] and all(
        seen[h]["shard"] for h in seen
    ), seen
