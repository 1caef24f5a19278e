"""Requests at S3's edges answered as S3 answers them (issue 38, the defects the
ceph/s3-tests run left), with boto3 and raw sockets against a real ``shipyard server``:

- a malformed ``x-amz-checksum-*`` value is S3's 400 ``InvalidRequest`` ("Value for
  x-amz-checksum-sha256 header is invalid."), a well-formed one that does not match the
  body is ``BadDigest``, a malformed ``Content-MD5`` stays ``InvalidDigest``;
- a key whose percent-escapes are not UTF-8 is 400 ``InvalidURI`` ("Couldn't parse the
  specified URI."), not a lookup of a mangled key (404);
- ``OPTIONS`` (a browser's CORS preflight, never signed) is S3's 400 without an
  ``Origin`` and 403 with one (CORS is not served), whatever the URL's query holds;
- ``Expect: 100-continue`` gets ``100 Continue`` only once the request's headers are
  authenticated: an unsigned or wrongly signed upload gets its 403 and no 100.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import urllib.error
import urllib.request

import pytest

from tests.integration.server.conftest import signed_headers

BUCKET = "edges"


@pytest.fixture(scope="module")
def s3(server):
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    client.create_bucket(Bucket=BUCKET)
    return client


def error_of(exc_info) -> tuple[int, str, str]:
    response = exc_info.value.response
    return (
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Code"],
        response["Error"].get("Message", ""),
    )


# -- checksums: malformed vs mismatching -----------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, header",
    [
        ({"ChecksumSHA256": "bad"}, "x-amz-checksum-sha256"),
        ({"ChecksumCRC32": "AAAA"}, "x-amz-checksum-crc32"),  # 3 bytes, not 4
        ({"ChecksumSHA1": base64.b64encode(b"\0" * 19).decode()}, "x-amz-checksum-sha1"),
    ],
    ids=["sha256-not-base64", "crc32-short", "sha1-short"],
)
def test_a_malformed_checksum_value_is_invalid_request(s3, kwargs, header):
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket=BUCKET, Key="ck/malformed", Body=b"hello", **kwargs)
    assert error_of(info) == (400, "InvalidRequest", f"Value for {header} header is invalid.")
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=BUCKET, Key="ck/malformed")


def test_a_well_formed_checksum_that_does_not_match_is_bad_digest(s3):
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket=BUCKET, Key="ck/wrong", Body=b"hello", ChecksumSHA256=wrong)
    status, code, message = error_of(info)
    assert (status, code) == (400, "BadDigest")
    assert message.startswith("The SHA256 you specified did not match the calculated checksum.")


def test_a_malformed_content_md5_stays_invalid_digest(s3):
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket=BUCKET, Key="ck/md5", Body=b"hello", ContentMD5="not base64!")
    assert error_of(info)[:2] == (400, "InvalidDigest")


# -- a key that is not UTF-8 -------------------------------------------------------------------
def _raw(server, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """One request over a socket, exactly as written (http.client would re-encode the
    path), and its whole answer."""
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n" + body)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "DELETE"])
def test_a_key_that_is_not_utf8_is_400_invalid_uri(server, s3, method):
    path = f"/{BUCKET}/%AE%8A-"  # Latin-1 bytes: not a UTF-8 key
    url = f"http://127.0.0.1:{server.port}{path}"
    headers = signed_headers(url, method)
    headers["Connection"] = "close"
    headers["Content-Length"] = "0"
    answer = _raw(server, method, path, headers)
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.split()[1] == b"400", answer[:300]
    if method != "HEAD":
        assert b"<Code>InvalidURI</Code>" in answer
        assert b"Couldn't parse the specified URI." in answer
    else:
        assert b"x-amz-error-code: InvalidURI" in answer
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="\ufffd").get("KeyCount") == 0


def test_a_utf8_key_with_the_same_characters_is_served(s3):
    """The same two characters sent as UTF-8 (what boto3 sends) are an ordinary key."""
    s3.put_object(Bucket=BUCKET, Key="\xae\x8a-", Body=b"fine")
    assert s3.get_object(Bucket=BUCKET, Key="\xae\x8a-")["Body"].read() == b"fine"


# -- OPTIONS: a CORS preflight ----------------------------------------------------------------
def _options(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method="OPTIONS", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_options_is_a_preflight_answered_as_s3_answers_it(s3):
    s3.put_object(Bucket=BUCKET, Key="pre/obj", Body=b"x")
    presigned = s3.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "pre/obj"}, ExpiresIn=600
    )
    plain = presigned.split("?", 1)[0]
    for url in (presigned, plain):
        status, body = _options(url, {})
        assert status == 400, body
        assert b"<Code>BadRequest</Code>" in body
        assert b"Insufficient information. Origin request header needed." in body
        status, body = _options(
            url, {"Origin": "http://example.com", "Access-Control-Request-Method": "GET"}
        )
        assert status == 403, body
        assert b"CORSResponse: CORS is not enabled for this bucket." in body
    # the presigned GET itself still works
    with urllib.request.urlopen(presigned, timeout=30) as answer:
        assert answer.read() == b"x"


# -- Expect: 100-continue ---------------------------------------------------------------------
def _first_answer(server, path: str, headers: dict[str, str]) -> bytes:
    """Send a head that asks for 100-continue and no body: the first status line back."""
    head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n", 1)[0]


def test_100_continue_only_after_the_signature_is_checked(server, s3):
    body = b"continued" * 10
    path = f"/{BUCKET}/cont/obj"
    url = f"http://127.0.0.1:{server.port}{path}"
    base = {"Host": f"127.0.0.1:{server.port}", "Content-Length": str(len(body))}
    # unsigned: refused before the body, no 100
    unsigned = dict(base, Expect="100-continue")
    assert _first_answer(server, path, unsigned).split()[1] == b"403"
    # signed with a wrong key: refused before the body, no 100
    good = dict(signed_headers(url, "PUT", body), **{"Content-Length": str(len(body))})
    bad = dict(good, Expect="100-continue")
    bad["Authorization"] = bad["Authorization"][:-4] + "0000"
    assert _first_answer(server, path, bad).split()[1] == b"403"
    # signed, to a bucket that is not there: its 404 before the body, no 100
    missing = f"/no-such-bucket-{server.port}/obj"
    murl = f"http://127.0.0.1:{server.port}{missing}"
    to_missing = dict(signed_headers(murl, "PUT", body), Expect="100-continue")
    to_missing["Content-Length"] = str(len(body))
    assert _first_answer(server, missing, to_missing).split()[1] == b"404"
    # signed rightly: 100, then the body, then 200
    headers = dict(good, Expect="100-continue")
    head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n")
        first = sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 100"), first
        sock.sendall(body)
        rest = b""
        while b"\r\n\r\n" not in rest:
            chunk = sock.recv(4096)
            if not chunk:
                break
            rest += chunk
    assert rest.split(b"\r\n", 1)[0].split()[1] == b"200", rest[:300]
    assert s3.get_object(Bucket=BUCKET, Key="cont/obj")["Body"].read() == body


def test_boto3_uploads_with_expect_continue_and_keeps_its_connection(s3):
    """botocore sends ``Expect: 100-continue`` with a file body: a refusal (404) is its
    final answer, and the next upload on the client goes through."""
    import io

    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket="edges-not-here", Key="k", Body=io.BytesIO(b"bar"))
    assert error_of(info)[:2] == (404, "NoSuchBucket")
    s3.put_object(Bucket=BUCKET, Key="cont/file", Body=io.BytesIO(b"bar" * 1000))
    assert s3.get_object(Bucket=BUCKET, Key="cont/file")["Body"].read() == b"bar" * 1000
