"""shipyard.data.tfrecord's framing byte for byte against TensorFlow's own writer (real
TensorFlow, so not in the unit tier: tests/unit/channels holds the framing's other rules)."""

from __future__ import annotations

import io
import os

import pytest

from shipyard.data import tfrecord

pytestmark = pytest.mark.tensorflow


def test_tfrecord_framing_matches_tensorflow(tmp_path):
    records = [os.urandom(n) for n in (0, 1, 100, 5000)]
    ours = b"".join(tfrecord.encode(r) for r in records)
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "t.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for r in records:
            writer.write(r)
    with open(path, "rb") as fh:
        assert fh.read() == ours
    assert list(tfrecord.read(io.BytesIO(ours), chunk=5, verify=True)) == records
    with pytest.raises(tfrecord.TFRecordError, match="corrupt TFRecord length"):
        list(tfrecord.read(io.BytesIO(b"\x05" + ours[1:])))
