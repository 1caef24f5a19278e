"""Pipe mode: two epochs through PipeModeDataset (via the sagemaker_tensorflow shim) and
through the torch PipeDataset; the records read equal the records written, in order."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile

import pytest

import shipyard
from shipyard.data import tfrecord

SCRIPT = r"""
import hashlib, json, os
from sagemaker_tensorflow import PipeModeDataset      # unmodified SageMaker import
import tensorflow as tf
from shipyard.data.torch import PipeDataset

def digest(records):
    return [hashlib.sha256(r).hexdigest()[:16] for r in records]

out = {"shim": PipeModeDataset.__module__}
ds = PipeModeDataset(channel="tfr", record_format="TFRecord")
assert isinstance(ds, tf.data.Dataset) and isinstance(ds, PipeModeDataset)
out["tf"] = [digest(r.numpy() for r in ds) for _ in range(2)]   # 2 iterators = 2 epochs
# the torch dataset continues the same channel's epoch count: epochs 2 and 3
torch_tf = PipeDataset("tfr", record_format="TFRecord")
out["torch_tfrecord"] = [digest(iter(torch_tf)) for _ in range(2)]
wrapped = PipeDataset("raw", record_format="RecordIO")
out["torch_recordio"] = [digest(iter(wrapped)) for _ in range(2)]
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "records.json"), "w") as fh:
    json.dump(out, fh)
"""


def digest(records):
    return [hashlib.sha256(r).hexdigest()[:16] for r in records]


@pytest.mark.timeout(240)
def test_pipe_two_epochs_tf_and_torch(session, write_script, bucket, tmp_path):
    # TFRecord files, gzip-compressed objects in S3 (CompressionType=Gzip)
    written = []
    for part in range(3):
        records = [os.urandom(50 + 7 * i) + bytes([part, i]) for i in range(40)]
        path = tmp_path / f"part-{part}.tfrecord"
        tfrecord.write(str(path), records)
        bucket.put(f"pipe/part-{part}.tfrecord.gz", gzip.compress(path.read_bytes()))
        written += records
    # raw local objects, each wrapped as one RecordIO record (RecordWrapperType=RecordIO)
    raw = tmp_path / "raw"
    raw.mkdir()
    objects = [os.urandom(n) for n in (1, 3, 4, 1000, 70000)]
    for i, data in enumerate(objects):
        (raw / f"obj-{i}").write_bytes(data)

    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=1,
        instance_type="local",
        input_mode="Pipe",
        framework_version="2.21",
        py_version="py3",
        session=session,
    )
    est.fit(
        {
            "tfr": shipyard.TrainingInput(bucket.uri("pipe/"), compression="Gzip"),
            "raw": shipyard.TrainingInput(str(raw), record_wrapping="RecordIO"),
        },
        job_name="pipe-epochs",
    )
    desc = est.latest_training_job.describe()
    with tarfile.open(desc["Shipyard"]["OutputArtifacts"].removeprefix("file://")) as tar:
        got = json.load(tar.extractfile("records.json"))

    assert got["shim"].startswith("shipyard.data")
    assert got["tf"] == [digest(written)] * 2
    assert got["torch_tfrecord"] == [digest(written)] * 2
    assert got["torch_recordio"] == [digest(objects)] * 2
    with open(
        os.path.join(
            session.home,
            "jobs",
            "pipe-epochs",
            "instances",
            "algo-1",
            "input",
            "config",
            "inputdataconfig.json",
        )
    ) as fh:
        config = json.load(fh)
    assert config["tfr"]["TrainingInputMode"] == "Pipe"
    assert config["raw"]["RecordWrapperType"] == "RecordIO"
