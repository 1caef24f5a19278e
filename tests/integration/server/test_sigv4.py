"""Off loopback the server verifies SigV4: the configured key works for every service
(JSON, REST-XML with a signed payload, query protocol), a wrong secret, an unsigned
request and a stale signature are refused with the error AWS gives, and the server
will not start off loopback without a key."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.integration.server.conftest import ROOT, ServerProcess, free_port

KEY, SECRET = "AKIDSHIPYARDTEST", "a-secret-only-the-test-knows"


@pytest.fixture(scope="module")
def signed_server(tmp_path_factory):
    home = str(tmp_path_factory.mktemp("sigv4-home"))
    proc = ServerProcess(
        home,
        free_port(),
        host="0.0.0.0",
        env={"SHIPYARD_SERVER_ACCESS_KEY": KEY, "SHIPYARD_SERVER_SECRET_KEY": SECRET},
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


def client(proc, service: str, secret: str = SECRET, **kw):
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        service,
        endpoint_url=proc.url,
        aws_access_key_id=KEY,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, **kw),
    )


def test_the_configured_key_works_for_every_protocol(signed_server):
    s3 = client(signed_server, "s3")
    s3.create_bucket(Bucket="signed-bucket")
    s3.put_object(Bucket="signed-bucket", Key="k", Body=b"payload")
    assert s3.get_object(Bucket="signed-bucket", Key="k")["Body"].read() == b"payload"
    assert client(signed_server, "sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
    assert client(signed_server, "sts").get_caller_identity()["Account"] == "000000000000"
    s3v4 = client(signed_server, "s3", signature_version="s3v4")  # SigV2 is not served
    url = s3v4.generate_presigned_url("get_object", Params={"Bucket": "signed-bucket", "Key": "k"})
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.read() == b"payload"


def test_wrong_unsigned_and_stale_requests_are_refused(signed_server):
    from botocore import UNSIGNED
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as info:
        client(signed_server, "sagemaker", secret="wrong").list_training_jobs()
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as info:
        client(signed_server, "s3", secret="wrong").list_buckets()
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as info:
        client(signed_server, "s3", signature_version=UNSIGNED).list_buckets()
    assert info.value.response["Error"]["Code"] == "AccessDenied"

    # a request signed correctly but 10 minutes ago (a replay) is refused
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(
        method="POST",
        url=signed_server.url + "/",
        data=b"{}",
        headers={
            "X-Amz-Target": "SageMaker.ListTrainingJobs",
            "Content-Type": "application/x-amz-json-1.1",
        },
    )
    signer = SigV4Auth(Credentials(KEY, SECRET), "sagemaker", "us-east-1")
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)

    class _Past(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return past

        @classmethod
        def utcnow(cls):
            return past.replace(tzinfo=None)

    import botocore.auth

    real = botocore.auth.datetime.datetime
    botocore.auth.datetime.datetime = _Past
    try:
        signer.add_auth(request)
    finally:
        botocore.auth.datetime.datetime = real
    prepared = request.prepare()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(
            urllib.request.Request(
                prepared.url, data=prepared.body, headers=dict(prepared.headers), method="POST"
            ),
            timeout=10,
        )
    assert err.value.code == 403 and b"RequestExpired" in err.value.read()


def test_a_signed_s3_body_cannot_be_swapped(signed_server):
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    client(signed_server, "s3").create_bucket(Bucket="swap-bucket")
    for key, body in (("small", b"original"), ("big", b"o" * (2 << 20))):
        request = AWSRequest(method="PUT", url=f"{signed_server.url}/swap-bucket/{key}", data=body)
        S3SigV4Auth(Credentials(KEY, SECRET), "s3", "us-east-1").add_auth(request)
        prepared = request.prepare()
        swapped = body.replace(b"o", b"x", 1)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(
                urllib.request.Request(
                    prepared.url, data=swapped, headers=dict(prepared.headers), method="PUT"
                ),
                timeout=30,
            )
        assert err.value.code == 400 and b"XAmzContentSHA256Mismatch" in err.value.read()
    listing = client(signed_server, "s3").list_objects_v2(Bucket="swap-bucket")
    assert "Contents" not in listing


def test_no_key_no_start_off_loopback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHIPYARD_SERVER_")}
    env.update(SHIPYARD_HOME=str(tmp_path), PYTHONPATH=os.path.join(ROOT, "src"))
    out = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "server", "--host", "0.0.0.0", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "SHIPYARD_SERVER_ACCESS_KEY" in out.stderr
