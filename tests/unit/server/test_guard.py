"""The guard in front of every service: the Host must be the server's, a state-changing
request must not come from a foreign web page, and the signature must be the server's
key's, with a presigned URL's expiry bounded. Requests are signed by botocore's signer."""

from __future__ import annotations

import datetime as dt
import io
import urllib.parse

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shipyard.server.errors import ApiError
from shipyard.server.guard import Names, authorize, host_name
from shipyard.server.http import Request

KEYS = {"AKID": "secret"}
LOCAL = Names.for_bind("127.0.0.1")


def request(method, url, body=b"", headers=None, service="s3", signer=None, host=None) -> Request:
    aws = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    if service == "s3" and signer is None:
        aws.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    if signer is not False:
        signer = signer or (S3SigV4Auth if service == "s3" else SigV4Auth)
        signer(Credentials("AKID", "secret"), service, "us-east-1").add_auth(aws)
    prepared = aws.prepare()
    parts = urllib.parse.urlsplit(prepared.url)
    hdrs = {k.lower(): v for k, v in prepared.headers.items()}
    hdrs["host"] = host or parts.netloc
    return Request(method, parts.path, parts.query, hdrs, io.BytesIO(body), len(body))


def test_names_the_server_answers_to():
    assert all(LOCAL.allows(h) for h in ("localhost", "127.0.0.1", "127.0.0.2", "::1"))
    assert LOCAL.allows("bucket.localhost")  # S3 virtual-hosted style
    assert not LOCAL.allows("attacker.example")
    assert not LOCAL.allows("localhost.attacker.example")
    assert not LOCAL.allows("10.1.2.3")
    named = Names.for_bind("10.1.2.3", ["Train.Example.Org"])
    assert named.allows("10.1.2.3") and named.allows("train.example.org")
    assert named.allows("my-bucket.train.example.org") and not named.allows("10.1.2.4")
    assert host_name("[::1]:8765") == "::1" and host_name("localhost:80") == "localhost"


def test_a_signed_request_is_authorized_and_names_its_service():
    req = request(
        "POST",
        "http://127.0.0.1:8765/",
        b"{}",
        {"X-Amz-Target": "SageMaker.ListTrainingJobs"},
        "sagemaker",
    )
    assert authorize(req, KEYS, LOCAL) == "sagemaker"
    assert authorize(request("GET", "http://localhost:8765/b/k"), KEYS, LOCAL) == "s3"


def test_unsigned_is_refused_in_the_services_shape():
    with pytest.raises(ApiError) as info:
        authorize(request("GET", "http://127.0.0.1:8765/b/k", signer=False), KEYS, LOCAL)
    assert (info.value.code, info.value.status) == ("AccessDenied", 403)
    req = request(
        "POST",
        "http://127.0.0.1:8765/",
        b"{}",
        {"X-Amz-Target": "SageMaker.CreateTrainingJob"},
        signer=False,
    )
    with pytest.raises(ApiError) as info:
        authorize(req, KEYS, LOCAL)
    assert (info.value.code, info.value.status) == ("MissingAuthenticationToken", 403)


def test_a_foreign_host_is_refused_before_the_signature():
    req = request("PUT", "http://attacker.example:8765/b/k", b"code")
    with pytest.raises(ApiError) as info:
        authorize(req, KEYS, LOCAL)
    assert info.value.code == "AccessDenied" and "Host" in info.value.message


@pytest.mark.parametrize(
    "extra",
    [
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
def test_a_state_change_from_a_foreign_page_is_refused(extra):
    req = request("POST", "http://127.0.0.1:8765/b?delete", b"<Delete/>", extra)
    with pytest.raises(ApiError) as info:
        authorize(req, KEYS, LOCAL)
    assert info.value.code == "AccessDenied" and "refused" in info.value.message
    # the same page reading is not a state change; the server's own origin may write
    assert authorize(request("GET", "http://127.0.0.1:8765/b/k", headers=extra), KEYS, LOCAL)
    own = {"Origin": "http://localhost:8765"}
    assert authorize(request("POST", "http://127.0.0.1:8765/b?delete", b"x", own), KEYS, LOCAL)


def presigned(expires: int = 60, when: dt.datetime | None = None) -> Request:
    aws = AWSRequest(method="GET", url="http://127.0.0.1:8765/b/k")
    signer = S3SigV4QueryAuth(Credentials("AKID", "secret"), "s3", "us-east-1", expires=expires)
    if when is not None:
        import botocore.auth

        class _At(dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return when

            @classmethod
            def utcnow(cls):
                return when.replace(tzinfo=None)

        real = botocore.auth.datetime.datetime
        botocore.auth.datetime.datetime = _At
        try:
            signer.add_auth(aws)
        finally:
            botocore.auth.datetime.datetime = real
    else:
        signer.add_auth(aws)
    parts = urllib.parse.urlsplit(aws.prepare().url)
    return Request("GET", parts.path, parts.query, {"host": parts.netloc}, io.BytesIO(), 0)


def test_presigned_urls_signature_and_expiry():
    assert authorize(presigned(), KEYS, LOCAL) == "s3"
    req = presigned()
    sig = req.arg("X-Amz-Signature") or ""
    req.raw_query = req.raw_query.replace(sig, "0" * len(sig))
    with pytest.raises(ApiError) as info:
        authorize(req, KEYS, LOCAL)
    assert info.value.code == "SignatureDoesNotMatch"
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=2)
    with pytest.raises(ApiError) as info:
        authorize(presigned(3600, old), KEYS, LOCAL)
    assert info.value.code == "AccessDenied" and "expired" in info.value.message
    for bad in ("0", "604801", "soon"):
        req = presigned()
        req.raw_query = req.raw_query.replace("X-Amz-Expires=60", f"X-Amz-Expires={bad}")
        with pytest.raises(ApiError) as info:
            authorize(req, KEYS, LOCAL)
        assert info.value.code == "AuthorizationQueryParametersError"
