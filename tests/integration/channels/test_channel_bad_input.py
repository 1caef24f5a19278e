"""Bad channel input: refused at fit() naming the channel, nothing written; failures in
the middle of a job name the object; a Pipe channel nobody reads does not hold the job."""

from __future__ import annotations

import gzip
import json
import os
import socket
import time

import pytest

import shipyard
from shipyard.errors import JobFailedError, ValidationError


def written(home) -> list[str]:
    """Files a refused submission left: the home's own bookkeeping (the store, the mark of a
    home made private) is not the job's."""
    from shipyard.control.home import PRIVATE_MARK

    out = []
    for _dirpath, _, files in os.walk(home):
        out += [f for f in files if not f.startswith("shipyard.db") and f != PRIVATE_MARK]
    return out


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.fixture
def est(session, write_script):
    def make(**kwargs):
        return shipyard.Estimator(
            entry_point="train.py",
            source_dir=write_script("train.py", "print('ok')\n"),
            instance_count=kwargs.pop("instance_count", 1),
            instance_type="local",
            session=session,
            **kwargs,
        )

    return make


def test_refusals_name_the_channel_and_write_nothing(est, bucket, home, tmp_path, monkeypatch):
    bucket.put("data/a.csv", b"1")
    bucket.put("data/b.csv", b"2")
    outside = tmp_path / "manifest.json"
    bucket.put("m/manifest.json", json.dumps([{"prefix": "s3://another-bucket/x/"}, "a"]).encode())
    cases = [
        (
            {"train": "s3://no-such-bucket-xyz/data"},
            "channel 'train': bucket 'no-such-bucket-xyz' does not exist",
        ),
        ({"train": bucket.uri("nothing/here")}, "channel 'train': no objects under"),
        (
            {"train": shipyard.TrainingInput(bucket.uri("data"), compression="Gzip")},
            "compression and record_wrapping apply to Pipe mode only",
        ),
        (
            {
                "train": shipyard.TrainingInput(
                    bucket.uri("m/manifest.json"), s3_data_type="ManifestFile"
                )
            },
            "points outside its bucket",
        ),
        (
            {"train": shipyard.TrainingInput(bucket.uri("data"), distribution="ShardedByS3Key")},
            "ShardedByS3Key over 3 instances needs at least 3 objects",
        ),
    ]
    for inputs, message in cases:
        with pytest.raises(ValidationError, match=message):
            est(instance_count=3).fit(inputs)
    with pytest.raises(ValidationError, match="input_mode='Stream'"):
        shipyard.TrainingInput(bucket.uri("data"), input_mode="Stream")
    with pytest.raises(ValidationError, match="output_path .* bucket 'missing-out' does not exist"):
        est(output_path="s3://missing-out/x").fit()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("SHIPYARD_S3_MAX_ATTEMPTS", "2")
    # bounded retries: the test's timeout is the hang guard
    with pytest.raises(ValidationError, match="channel 'train': the S3 endpoint .* did not answer"):
        est().fit({"train": bucket.uri("data")})
    assert not outside.exists()
    assert written(home) == []


READ_PIPE = r"""
import os
with open(os.path.join(os.environ["SM_INPUT_DIR"], "data", "train_0"), "rb") as fh:
    fh.read()
"""


@pytest.mark.timeout(120)
def test_corrupt_gzip_fails_naming_the_object(session, write_script, bucket):
    bucket.put("gz/a.gz", gzip.compress(b"fine"))
    bucket.put("gz/b.gz", b"\x1f\x8b\x08\x00 this is not gzip")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", READ_PIPE),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    with pytest.raises(JobFailedError) as info:
        est.fit(
            {
                "train": shipyard.TrainingInput(
                    bucket.uri("gz/"), compression="Gzip", input_mode="Pipe"
                )
            },
            job_name="bad-gzip",
        )
    assert f"object s3://{bucket.name}/gz/b.gz is not valid gzip" in info.value.reason


@pytest.mark.timeout(60)
def test_pipe_channel_never_opened_does_not_hold_the_job(session, write_script, tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "x").write_bytes(b"x" * 100)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", "print('not reading')\n"),
        instance_count=1,
        instance_type="local",
        session=session,
        input_mode="Pipe",
    )
    est.fit({"train": str(data)}, job_name="unread-pipe")  # the test's timeout guards a hang
    assert est.latest_training_job.describe()["TrainingJobStatus"] == "Completed"


@pytest.fixture
def s3_with_auth():
    """moto's server with IAM checks on (INITIAL_NO_AUTH_ACTION_COUNT): the first two
    requests (bucket, object) pass, every later one needs credentials it knows."""
    import subprocess
    import sys

    import boto3

    port = closed_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="2")
    proc = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "moto_server"),
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="AKIASETUP",
            aws_secret_access_key="setup",
        )
        client.create_bucket(Bucket="authed-bucket")
        client.put_object(Bucket="authed-bucket", Key="train/a.txt", Body=b"1")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def test_bad_credentials_are_refused_naming_the_channel(est, s3_with_auth, home, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_with_auth)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONG")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(
        ValidationError,
        match="channel 'training': .* refused the credentials "
        r"\(InvalidAccessKeyId\).*AWS_ACCESS_KEY_ID",
    ):
        est().fit({"training": "s3://authed-bucket/train/"})
    assert written(home) == []
