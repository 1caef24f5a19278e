"""The server's SigV4 check agrees with botocore's signer, for every protocol's shape, and
refuses a changed byte, a wrong key and a stale date."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import urllib.parse

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shipyard.server import sigv4
from shipyard.server.errors import ApiError

KEYS = {"AKID": "secret"}


def signed(method, url, body, headers, service, auth_cls=SigV4Auth, secret="secret"):
    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    auth_cls(Credentials("AKID", secret), service, "us-east-1").add_auth(request)
    prepared = request.prepare()
    parts = urllib.parse.urlsplit(prepared.url)
    hdrs = {k.lower(): v for k, v in prepared.headers.items()}
    hdrs.setdefault("host", parts.netloc)
    return parts.path, parts.query, hdrs, prepared.body or b""


CASES = [
    (
        "POST",
        "http://127.0.0.1:8765/",
        b'{"TrainingJobName": "x"}',
        {"X-Amz-Target": "SageMaker.DescribeTrainingJob"},
        "sagemaker",
        SigV4Auth,
    ),
    (
        "POST",
        "http://127.0.0.1:8765/endpoints/my%20ep/invocations",
        b"[1, 2]",
        {"Content-Type": "application/json"},
        "sagemaker",
        SigV4Auth,
    ),
    (
        "POST",
        "http://127.0.0.1:8765/",
        b"Action=GetCallerIdentity&Version=2011-06-15",
        {"Content-Type": "application/x-www-form-urlencoded"},
        "sts",
        SigV4Auth,
    ),
    (
        "PUT",
        "http://127.0.0.1:8765/bucket/a%20key/with+plus~and%2Fslash",
        b"data",
        {},
        "s3",
        S3SigV4Auth,
    ),
    (
        "GET",
        "http://127.0.0.1:8765/bucket?list-type=2&prefix=a%2Fb&delimiter=%2F",
        b"",
        {},
        "s3",
        S3SigV4Auth,
    ),
]


@pytest.mark.parametrize("method,url,body,headers,service,auth", CASES)
def test_agrees_with_botocore(method, url, body, headers, service, auth):
    path, query, hdrs, body = signed(method, url, body, headers, service, auth)
    scope = sigv4.scope(hdrs, urllib.parse.parse_qs(query))
    assert scope is not None and scope.service == service
    body_hash = hashlib.sha256(body).hexdigest()
    sigv4.verify(scope, method, path, query, hdrs, body_hash, KEYS)
    with pytest.raises(ApiError) as err:
        sigv4.verify(scope, method, path + "x", query, hdrs, body_hash, KEYS)
    assert err.value.code == "SignatureDoesNotMatch"


def test_wrong_key_and_stale_date():
    path, query, hdrs, body = signed(*CASES[0][:5], secret="other")
    scope = sigv4.scope(hdrs, {})
    with pytest.raises(ApiError, match="does not match"):
        sigv4.verify(scope, "POST", path, query, hdrs, "", KEYS)
    path, query, hdrs, body = signed(*CASES[0][:5])
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=6)
    with pytest.raises(ApiError) as err:
        sigv4.verify(scope, "POST", path, query, hdrs, "", KEYS, now=later)
    assert err.value.code == "RequestExpired"
    with pytest.raises(ApiError) as err:
        unknown = dataclasses.replace(sigv4.scope(hdrs, {}), access_key="NOPE")
        sigv4.verify(unknown, "POST", path, query, hdrs, "", KEYS)
    assert err.value.code == "InvalidClientTokenId"


def test_unsigned_request_has_no_scope_and_a_bad_scope_is_refused():
    assert sigv4.scope({}, {}) is None
    with pytest.raises(ApiError, match="credential scope"):
        sigv4.scope(
            {
                "authorization": "AWS4-HMAC-SHA256 Credential=AKID/x, SignedHeaders=host, "
                "Signature=ab"
            },
            {},
        )
