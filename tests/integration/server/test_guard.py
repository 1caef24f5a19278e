"""On loopback too, the server answers only signed requests that name it as their Host and
carry no foreign Origin: a web page (DNS rebinding, a cross-site form) and a local user
without the key are refused with AWS's error shapes, and nothing changes. Presigned URLs
work with their signature and expiry checked. The key is the home's own, 0600 in a 0700
home. Real server process, real sockets, botocore's signer as the client."""

from __future__ import annotations

import http.client
import json
import os
import stat
import urllib.parse

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

pytestmark = pytest.mark.usefixtures("server")


def keys() -> Credentials:
    return Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])


def call(
    server,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    service: str | None = "s3",
    host: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request over a fresh connection; signed for ``service`` unless it is None, with
    ``host`` as the Host header (and in the signature)."""
    authority = host or f"127.0.0.1:{server.port}"
    hdrs = dict(headers or {})
    if service is not None:
        request = AWSRequest(
            method=method, url=f"http://{authority}{path}", data=body, headers=hdrs
        )
        signer = S3SigV4Auth if service == "s3" else SigV4Auth
        signer(keys(), service, "us-east-1").add_auth(request)
        hdrs = dict(request.headers.items())
    hdrs["Host"] = authority
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def s3():
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(signature_version="s3v4"))


def test_unsigned_requests_are_refused_in_each_services_shape(server):
    s3().create_bucket(Bucket="guarded")
    s3().put_object(Bucket="guarded", Key="k", Body=b"kept")
    status, _, body = call(server, "GET", "/guarded/k", service=None)
    assert status == 403 and b"<Code>AccessDenied</Code>" in body and b"not signed" in body
    status, _, body = call(server, "PUT", "/guarded/k", b"overwritten", service=None)
    assert status == 403 and b"<Code>AccessDenied</Code>" in body
    status, headers, body = call(
        server,
        "POST",
        "/",
        b"{}",
        {
            "X-Amz-Target": "SageMaker.ListTrainingJobs",
            "Content-Type": "application/x-amz-json-1.1",
        },
        service=None,
    )
    assert status == 403 and json.loads(body)["__type"] == "MissingAuthenticationToken"
    assert headers["x-amzn-errortype"] == "MissingAuthenticationToken"
    assert s3().get_object(Bucket="guarded", Key="k")["Body"].read() == b"kept"


def test_a_foreign_host_is_refused_even_signed(server):
    """DNS rebinding: the page's own name arrives as Host. Signed or not, refused."""
    s3().create_bucket(Bucket="rebound")
    for service in (None, "s3"):
        status, _, body = call(
            server,
            "PUT",
            "/rebound/x",
            b"code",
            service=service,
            host=f"attacker.example:{server.port}",
        )
        assert status == 403 and b"<Code>AccessDenied</Code>" in body and b"Host" in body
    status, _, body = call(
        server,
        "POST",
        "/",
        b"{}",
        {
            "X-Amz-Target": "SageMaker.ListTrainingJobs",
            "Content-Type": "application/x-amz-json-1.1",
        },
        service="sagemaker",
        host=f"attacker.example:{server.port}",
    )
    assert status == 403 and json.loads(body)["__type"] == "AccessDeniedException"
    assert "Contents" not in s3().list_objects_v2(Bucket="rebound")
    # the server's own names still work: localhost, and a bucket as a subdomain of it
    status, _, _ = call(server, "PUT", "/rebound/ok", b"fine", host=f"localhost:{server.port}")
    assert status == 200
    status, _, body = call(server, "GET", "/ok", host=f"rebound.localhost:{server.port}")
    assert (status, body) == (200, b"fine")


def test_a_cross_site_delete_is_refused(server):
    s3().create_bucket(Bucket="csrf")
    s3().put_object(Bucket="csrf", Key="job/output/model.tar.gz", Body=b"weights")
    delete = (
        b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object>'
        b"<Key>job/output/model.tar.gz</Key></Object></Delete>"
    )
    for extra in (
        {"Origin": "http://attacker.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "null"},
    ):
        status, _, body = call(
            server, "POST", "/csrf?delete", delete, {"Content-Type": "text/plain", **extra}
        )
        assert status == 403 and b"<Code>AccessDenied</Code>" in body, extra
    assert (
        s3().get_object(Bucket="csrf", Key="job/output/model.tar.gz")["Body"].read() == b"weights"
    )
    # a GET with a foreign Origin changes nothing, and is answered
    status, _, _ = call(
        server,
        "GET",
        "/csrf/job/output/model.tar.gz",
        headers={"Origin": "http://attacker.example"},
    )
    assert status == 200


def test_presigned_urls_are_checked(server):
    s3().create_bucket(Bucket="presigned")
    s3().put_object(Bucket="presigned", Key="k", Body=b"shared")
    url = s3().generate_presigned_url(
        "get_object", Params={"Bucket": "presigned", "Key": "k"}, ExpiresIn=60
    )
    parts = urllib.parse.urlsplit(url)
    path = f"{parts.path}?{parts.query}"
    assert call(server, "GET", path, service=None)[0] == 200
    query = urllib.parse.parse_qs(parts.query)
    sig = query["X-Amz-Signature"][0]
    tampered = path.replace(sig, ("0" if sig[0] != "0" else "1") + sig[1:])
    status, _, body = call(server, "GET", tampered, service=None)
    assert status == 403 and b"SignatureDoesNotMatch" in body
    longer = path.replace("X-Amz-Expires=60", "X-Amz-Expires=3600")
    status, _, body = call(server, "GET", longer, service=None)
    assert status == 403 and b"SignatureDoesNotMatch" in body
    # a URL past its expiry: signed an hour ago, valid for a minute
    stamp = query["X-Amz-Date"][0]
    import datetime as dt

    old = (dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ") - dt.timedelta(hours=1)).strftime(
        "%Y%m%dT%H%M%SZ"
    )
    status, _, body = call(server, "GET", path.replace(stamp, old), service=None)
    assert status == 403 and b"expired" in body
    status, _, body = call(
        server, "GET", path.replace("X-Amz-Expires=60", "X-Amz-Expires=x"), service=None
    )
    assert status == 400 and b"AuthorizationQueryParametersError" in body


def test_the_key_is_the_homes_own_and_private(server):
    home = server.home
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    creds = os.path.join(home, "server", "credentials.json")
    assert stat.S_IMODE(os.stat(creds).st_mode) == 0o600
    with open(creds) as fh:
        data = json.load(fh)
    assert data["secret_key"] == os.environ["AWS_SECRET_ACCESS_KEY"]
    assert len(data["secret_key"]) >= 40 and data["secret_key"] != "shipyard-local-secret"
