"""ShardedByS3Key over 3 instances; s3:// output_path, code_location and checkpoints."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

import shipyard

SHARD_SCRIPT = r"""
import json, os
out = {ch: sorted(os.listdir(os.environ["SM_CHANNEL_" + ch.upper()])) for ch in ("s3", "local")}
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], os.environ["SM_CURRENT_HOST"]), "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.timeout(120)
def test_sharded_by_s3_key_on_three_instances(session, write_script, bucket, tmp_path):
    names = [f"shard-{i:02d}.csv" for i in range(10)]
    for name in names:
        bucket.put("sharded/" + name, name.encode())
    local = tmp_path / "local"
    local.mkdir()
    for name in names[:7]:
        (local / name).write_text(name)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SHARD_SCRIPT),
        instance_count=3,
        instance_type="local",
        session=session,
    )
    est.fit(
        {
            "s3": shipyard.TrainingInput(bucket.uri("sharded"), distribution="ShardedByS3Key"),
            "local": shipyard.TrainingInput(str(local), distribution="ShardedByS3Key"),
        },
        job_name="sharded",
    )
    out = est.latest_training_job.describe()["Shipyard"]["OutputArtifacts"]
    with tarfile.open(out.removeprefix("file://")) as tar:
        seen = {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers()}
    for channel, expected in (("s3", names), ("local", names[:7])):
        shards = [set(seen[h][channel]) for h in ("algo-1", "algo-2", "algo-3")]
        assert all(shards), shards  # nobody left empty
        assert sum(map(len, shards)) == len(expected)  # disjoint
        assert set().union(*shards) == set(expected)  # complete


CKPT_SCRIPT = r"""
import os, time, boto3
ckpt = os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "checkpoints")  # /opt/ml/checkpoints
assert open(os.path.join(ckpt, "epoch-0.ckpt")).read() == "from an earlier run"
with open(os.path.join(ckpt, "epoch-1.ckpt"), "w") as fh:
    fh.write("written during the job")
s3 = boto3.client("s3")
bucket, prefix = os.environ["CKPT_BUCKET"], "ckpt/epoch-1.ckpt"
deadline = time.time() + 30
while time.time() < deadline:          # uploaded while the script still runs
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount"):
        break
    time.sleep(0.1)
else:
    raise SystemExit("epoch-1.ckpt was not uploaded during the job")
with open(os.path.join(ckpt, "epoch-2.ckpt"), "w") as fh:
    fh.write("written at the end")
open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w").write("weights")
"""


@pytest.mark.timeout(120)
def test_s3_output_code_location_and_checkpoints(session, write_script, bucket, monkeypatch):
    monkeypatch.setenv("SHIPYARD_CHECKPOINT_SYNC_SECONDS", "0.2")
    bucket.put("ckpt/epoch-0.ckpt", b"from an earlier run")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", CKPT_SCRIPT),
        instance_count=1,
        instance_type="local",
        session=session,
        output_path=bucket.uri("out"),
        code_location=bucket.uri("code"),
        checkpoint_s3_uri=bucket.uri("ckpt"),
        # the script's own boto3 calls: a job inherits no key from the notebook's process
        # (issue 37), it is given one, as a role would give it on SageMaker
        environment={
            "CKPT_BUCKET": bucket.name,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        },
    )
    est.fit(job_name="s3-artifacts")
    desc = est.latest_training_job.describe()
    assert desc["ModelArtifacts"]["S3ModelArtifacts"] == bucket.uri(
        "out/s3-artifacts/output/model.tar.gz"
    )
    with tarfile.open(
        fileobj=io.BytesIO(bucket.get("out/s3-artifacts/output/model.tar.gz"))
    ) as tar:
        assert tar.extractfile("model.txt").read() == b"weights"
    assert bucket.keys("out/s3-artifacts/output/") == [
        "out/s3-artifacts/output/model.tar.gz",
        "out/s3-artifacts/output/output.tar.gz",
    ]
    assert json.loads(desc["HyperParameters"]["sagemaker_submit_directory"]) == bucket.uri(
        "code/s3-artifacts/source/sourcedir.tar.gz"
    )
    assert bucket.keys("code/") == ["code/s3-artifacts/source/sourcedir.tar.gz"]
    assert bucket.get("ckpt/epoch-1.ckpt") == b"written during the job"
    assert bucket.get("ckpt/epoch-2.ckpt") == b"written at the end"
    assert desc["CheckpointConfig"]["S3Uri"] == bucket.uri("ckpt")
