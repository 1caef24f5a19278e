"""Issue 20, defect 7: big artifacts move through boto3's transfer manager.

Before the fix an upload was one PutObject (over 5 GiB fails), a download one stream, and
``exists()`` answered for the bucket whatever the key. With a 5 MiB multipart threshold
against the loopback S3 server, a 12 MiB model is uploaded in 3 parts (its ETag says so),
downloads back intact, and ``exists()`` tells a missing key from a present one.
"""

from __future__ import annotations

import hashlib
import os

import shipyard
from shipyard import storage
from shipyard.storage.api import ObjectInfo

MiB = 1 << 20


def test_upload_is_multipart_and_download_is_intact(bucket, monkeypatch, tmp_path):
    monkeypatch.setenv("SHIPYARD_S3_MULTIPART_THRESHOLD", str(5 * MiB))
    data = os.urandom(12 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    loc = storage.parse(bucket.uri("models/big.bin"))
    store = storage.store_for(loc)
    store.upload(str(src), loc)
    head = bucket.client.head_object(Bucket=bucket.name, Key="models/big.bin")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # 5 + 5 + 2 MiB parts
    dest = tmp_path / "back" / "big.bin"
    store.download(ObjectInfo(loc, len(data), "big.bin"), str(dest))
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert [p.name for p in dest.parent.iterdir()] == ["big.bin"]  # no temp file left


def test_exists_checks_the_key_not_the_bucket(bucket):
    bucket.put("present/key.txt", b"x")
    store = storage.store_for(storage.parse(bucket.uri()))
    assert store.exists(storage.parse(bucket.uri("present/key.txt")))
    assert not store.exists(storage.parse(bucket.uri("absent/key.txt")))
    assert store.exists(storage.parse(bucket.uri()))  # no key: the bucket
    assert not store.exists(storage.parse("s3://no-such-bucket-shipyard/key"))


def test_job_model_over_the_threshold_is_uploaded_in_parts(
    bucket, monkeypatch, session, write_script
):
    monkeypatch.setenv("SHIPYARD_S3_MULTIPART_THRESHOLD", str(5 * MiB))
    src = write_script(
        "train.py",
        "import os\n"
        "with open(os.path.join(os.environ['SM_MODEL_DIR'], 'w.bin'), 'wb') as fh:\n"
        "    fh.write(os.urandom(11 << 20))\n",
    )
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
        output_path=bucket.uri("out"),
    )
    est.fit(job_name="big-model", logs=False)
    key = "out/big-model/output/model.tar.gz"
    head = bucket.client.head_object(Bucket=bucket.name, Key=key)
    assert head["ContentLength"] > 10 * MiB
    assert "-" in head["ETag"], head["ETag"]  # a multipart object


def test_an_interrupted_multipart_upload_is_aborted_by_the_cleanup(bucket, tmp_path):
    """What a supervisor killed mid-upload leaves in the bucket: parts of an upload that
    never completed. The reconcile's cleanup (artifacts.discard_partial) aborts them."""
    from shipyard.control import artifacts

    key = "out/cut-job/output/model.tar.gz"
    up = bucket.client.create_multipart_upload(Bucket=bucket.name, Key=key)
    bucket.client.upload_part(
        Bucket=bucket.name, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * MiB
    )
    removed = artifacts.discard_partial(bucket.uri("out"), "cut-job", str(tmp_path))
    assert len(removed) == 1, removed
    left = bucket.client.list_multipart_uploads(Bucket=bucket.name).get("Uploads", [])
    assert left == []
