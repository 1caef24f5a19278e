"""S3 as S3 behaves, for what SageMaker workflows use, with boto3 (signed with the key
``shipyard server env`` prints) against a real server process: operations not served are
refused with NotImplemented and leave the object and bucket intact; multipart uploads are
listed so a cleanup finds them; interrupted uploads leave nothing; copies, digests,
conditional writes, metadata directives, listings and key rules as S3 answers them."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import socket
import struct
import time
import urllib.request

import pytest

from tests.integration.server.conftest import signed_headers

BODY = b"model-weights" * 100


@pytest.fixture(scope="module")
def s3(server):
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    client.create_bucket(Bucket="conf")
    return client


def error_code(exc_info) -> str:
    return exc_info.value.response["Error"]["Code"]


def intact(s3, key: str) -> None:
    s3.head_bucket(Bucket="conf")
    assert s3.get_object(Bucket="conf", Key=key)["Body"].read() == BODY


DESTRUCTIVE = {
    "PutObjectTagging": lambda s3, k: s3.put_object_tagging(
        Bucket="conf", Key=k, Tagging={"TagSet": [{"Key": "t", "Value": "v"}]}
    ),
    "PutObjectAcl": lambda s3, k: s3.put_object_acl(Bucket="conf", Key=k, ACL="private"),
    "DeleteObjectTagging": lambda s3, k: s3.delete_object_tagging(Bucket="conf", Key=k),
    "GetObjectAcl": lambda s3, k: s3.get_object_acl(Bucket="conf", Key=k),
    "GetObjectTagging": lambda s3, k: s3.get_object_tagging(Bucket="conf", Key=k),
    "PutObjectRetention": lambda s3, k: s3.put_object_retention(
        Bucket="conf", Key=k, Retention={"Mode": "GOVERNANCE"}
    ),
    "DeleteBucketTagging": lambda s3, k: s3.delete_bucket_tagging(Bucket="conf"),
    "DeleteBucketCors": lambda s3, k: s3.delete_bucket_cors(Bucket="conf"),
    "DeleteBucketLifecycle": lambda s3, k: s3.delete_bucket_lifecycle(Bucket="conf"),
    "DeleteBucketPolicy": lambda s3, k: s3.delete_bucket_policy(Bucket="conf"),
    "PutBucketPolicy": lambda s3, k: s3.put_bucket_policy(Bucket="conf", Policy="{}"),
    "PutBucketVersioning": lambda s3, k: s3.put_bucket_versioning(
        Bucket="conf", VersioningConfiguration={"Status": "Enabled"}
    ),
    "PutBucketAcl": lambda s3, k: s3.put_bucket_acl(Bucket="conf", ACL="private"),
    "GetObjectVersion": lambda s3, k: s3.get_object(Bucket="conf", Key=k, VersionId="v1"),
}


@pytest.mark.parametrize("operation", sorted(DESTRUCTIVE))
def test_an_operation_not_served_is_not_implemented_and_changes_nothing(s3, operation):
    key = f"sub/{operation}"
    s3.put_object(Bucket="conf", Key=key, Body=BODY)
    with pytest.raises(s3.exceptions.ClientError) as info:
        DESTRUCTIVE[operation](s3, key)
    assert error_code(info) == "NotImplemented"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
    intact(s3, key)


def test_interrupted_uploads_are_listed_and_the_cleanup_removes_them(server, s3):
    from shipyard.storage.s3 import S3Store
    from shipyard.storage.uri import parse

    key = "job/output/model.tar.gz"
    upload = s3.create_multipart_upload(Bucket="conf", Key=key)["UploadId"]
    for number in (1, 2):
        s3.upload_part(Bucket="conf", Key=key, UploadId=upload, PartNumber=number, Body=b"p" * 99)
    listed = s3.list_multipart_uploads(Bucket="conf", Prefix="job/")
    assert [(u["Key"], u["UploadId"]) for u in listed["Uploads"]] == [(key, upload)]
    assert listed["IsTruncated"] is False
    assert s3.list_multipart_uploads(Bucket="conf", Prefix="other/").get("Uploads", []) == []
    parts = s3.list_parts(Bucket="conf", Key=key, UploadId=upload, MaxParts=1)
    assert [(p["PartNumber"], p["Size"]) for p in parts["Parts"]] == [(1, 99)]
    assert parts["IsTruncated"] is True
    rest = s3.list_parts(
        Bucket="conf", Key=key, UploadId=upload, PartNumberMarker=parts["NextPartNumberMarker"]
    )
    assert [p["PartNumber"] for p in rest["Parts"]] == [2]
    assert rest["Parts"][0]["ETag"] == f'"{hashlib.md5(b"p" * 99).hexdigest()}"'
    assert S3Store().abort_incomplete_uploads(parse("s3://conf/job/")) == 1
    assert s3.list_multipart_uploads(Bucket="conf").get("Uploads", []) == []
    assert os.listdir(os.path.join(server.home, "s3", "uploads")) == []


def _files(root: str) -> set[str]:
    out = set()
    for top, _, names in os.walk(os.path.join(root, "s3")):
        out |= {os.path.join(top, n) for n in names if not n.startswith("index.db")}
    return out


@pytest.mark.parametrize("part", [False, True], ids=["put", "part"])
def test_a_client_reset_mid_upload_leaves_no_file(server, s3, part):
    path = "/conf/cut"
    if part:
        upload = s3.create_multipart_upload(Bucket="conf", Key="cut")["UploadId"]
        path += f"?partNumber=1&uploadId={upload}"
    before = _files(server.home)
    headers = signed_headers(server.url + path, "PUT", headers={"Content-Length": "10000000"})
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(f"PUT {path} HTTP/1.1\r\n{head}\r\n".encode() + b"a" * 2_000_000)
    time.sleep(0.5)  # the server is mid-body
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST
    deadline = time.monotonic() + 30
    while _files(server.home) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _files(server.home) - before == set()
    with urllib.request.urlopen(server.url + "/_shipyard/health", timeout=10) as resp:
        assert resp.status == 200
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket="conf", Key="cut")
    if part:
        s3.abort_multipart_upload(Bucket="conf", Key="cut", UploadId=upload)


def test_a_managed_copy_of_20_mib_uses_upload_part_copy(s3):
    from boto3.s3.transfer import TransferConfig

    big = os.urandom(20 << 20)
    s3.put_object(Bucket="conf", Key="big", Body=big)
    s3.copy(
        {"Bucket": "conf", "Key": "big"},
        "conf",
        "big-copy",
        Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20),
    )
    copied = s3.get_object(Bucket="conf", Key="big-copy")
    assert copied["Body"].read() == big and copied["ETag"].endswith('-3"')
    assert s3.list_multipart_uploads(Bucket="conf").get("Uploads", []) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ChecksumSHA256": base64.b64encode(b"\0" * 32).decode()},
        {"ChecksumCRC32": "AAAAAA=="},
        {"ChecksumSHA1": base64.b64encode(b"\0" * 20).decode()},
        {"ContentMD5": base64.b64encode(b"\0" * 16).decode()},
    ],
    ids=["sha256", "crc32", "sha1", "md5"],
)
def test_a_wrong_digest_is_refused_and_nothing_stored(s3, kwargs):
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket="conf", Key="digest", Body=b"hello", **kwargs)
    assert error_code(info) == "BadDigest"
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket="conf", Key="digest")


def test_right_digests_are_accepted(s3):
    md5 = base64.b64encode(hashlib.md5(b"hello").digest()).decode()
    sha = base64.b64encode(hashlib.sha256(b"hello").digest()).decode()
    s3.put_object(Bucket="conf", Key="good", Body=b"hello", ContentMD5=md5)
    s3.put_object(Bucket="conf", Key="good", Body=b"hello", ChecksumSHA256=sha)
    s3.put_object(Bucket="conf", Key="good", Body=b"hello", ChecksumAlgorithm="CRC32")
    assert s3.get_object(Bucket="conf", Key="good")["Body"].read() == b"hello"


def test_if_none_match_star_writes_only_a_new_key(s3):
    s3.put_object(Bucket="conf", Key="once", Body=BODY, IfNoneMatch="*")
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket="conf", Key="once", Body=b"second", IfNoneMatch="*")
    assert error_code(info) == "PreconditionFailed"
    intact(s3, "once")


def test_copy_with_metadata_directive(s3):
    s3.put_object(
        Bucket="conf", Key="meta", Body=BODY, ContentType="text/plain", Metadata={"a": "1"}
    )
    s3.copy_object(Bucket="conf", Key="meta-copy", CopySource="conf/meta")
    head = s3.head_object(Bucket="conf", Key="meta-copy")
    assert head["Metadata"] == {"a": "1"} and head["ContentType"] == "text/plain"
    s3.copy_object(
        Bucket="conf",
        Key="meta",
        CopySource="conf/meta",
        MetadataDirective="REPLACE",
        Metadata={"b": "2"},
        ContentType="application/x-tar",
    )
    head = s3.head_object(Bucket="conf", Key="meta")
    assert head["Metadata"] == {"b": "2"} and head["ContentType"] == "application/x-tar"
    intact(s3, "meta")
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.copy_object(Bucket="conf", Key="meta", CopySource="conf/meta")
    assert error_code(info) == "InvalidRequest"


def test_listings_paginate_encode_and_echo(server, s3):
    s3.create_bucket(Bucket="listing")
    keys = ["a/1", "a/2", "b/1", "c d+e", "z"]
    for key in keys:
        s3.put_object(Bucket="listing", Key=key, Body=b"x")
    seen, token, pages = [], None, 0
    while True:
        kwargs = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket="listing", Delimiter="/", MaxKeys=1, **kwargs)
        pages += 1
        if token:
            assert page["ContinuationToken"] == token
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        seen += [o["Key"] for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert seen == ["a/", "b/", "c d+e", "z"] and pages == 4
    after = s3.list_objects_v2(Bucket="listing", StartAfter="b/1")
    assert after["StartAfter"] == "b/1" and [o["Key"] for o in after["Contents"]] == ["c d+e", "z"]
    # botocore asks for EncodingType=url on every listing and decodes the keys itself (so
    # "+" in a key survives only if the server encoded it); asked explicitly, it does not
    encoded = s3.list_objects_v2(Bucket="listing", EncodingType="url", Prefix="c")
    assert [o["Key"] for o in encoded["Contents"]] == ["c%20d%2Be"]
    v1 = s3.list_objects(Bucket="listing", Delimiter="/", Marker="a/")
    assert [p["Prefix"] for p in v1["CommonPrefixes"]] == ["b/"]
    assert [o["Key"] for o in v1["Contents"]] == ["c d+e", "z"] and not v1["IsTruncated"]
    # on the wire the keys are percent-encoded (botocore decoded them above)
    url = f"{server.url}/listing?list-type=2&encoding-type=url&prefix=c"
    request = urllib.request.Request(url, headers=signed_headers(url, "GET"))
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert b"<Key>c%20d%2Be</Key>" in resp.read()


def test_key_rules_and_batch_delete_limit(s3):
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket="conf", Key="k" * 1025, Body=b"x")
    assert error_code(info) == "KeyTooLongError"
    s3.put_object(Bucket="conf", Key="k" * 1024, Body=b"x")  # the limit itself is fine
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket="conf", Key="nul\x00key", Body=b"x")
    assert error_code(info) == "InvalidArgument"
    s3.put_object(Bucket="conf", Key="victim", Body=BODY)
    objects = [{"Key": "victim"}] + [{"Key": f"n{i}"} for i in range(1000)]
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.delete_objects(Bucket="conf", Delete={"Objects": objects})
    assert error_code(info) == "MalformedXML"
    intact(s3, "victim")
    done = s3.delete_objects(Bucket="conf", Delete={"Objects": objects[:1000], "Quiet": True})
    assert "Deleted" not in done
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket="conf", Key="victim")


def test_get_by_part_number(s3):
    s3.put_object(Bucket="conf", Key="single", Body=BODY)
    assert s3.get_object(Bucket="conf", Key="single", PartNumber=1)["Body"].read() == BODY
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.get_object(Bucket="conf", Key="single", PartNumber=2)
    assert error_code(info) == "InvalidPartNumber"
    upload = s3.create_multipart_upload(Bucket="conf", Key="multi")["UploadId"]
    bodies = [b"a" * (5 << 20), b"b" * 1000]
    etags = [
        s3.upload_part(Bucket="conf", Key="multi", UploadId=upload, PartNumber=n, Body=b)["ETag"]
        for n, b in enumerate(bodies, 1)
    ]
    s3.complete_multipart_upload(
        Bucket="conf",
        Key="multi",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    second = s3.get_object(Bucket="conf", Key="multi", PartNumber=2)
    assert second["Body"].read() == bodies[1] and second["PartsCount"] == 2
    assert second["ContentRange"] == f"bytes {5 << 20}-{(5 << 20) + 999}/{(5 << 20) + 1000}"
    assert s3.head_object(Bucket="conf", Key="multi", PartNumber=1)["ContentLength"] == 5 << 20
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.get_object(Bucket="conf", Key="multi", PartNumber=3)
    assert error_code(info) == "InvalidPartNumber"


def test_a_chunked_put_streams_to_an_object(server, s3):
    """Transfer-Encoding: chunked (a body of unknown length, as curl -T - sends)."""
    body = os.urandom(3 << 20)
    path = "/conf/chunked"
    headers = signed_headers(server.url + path, "PUT", body, {"Transfer-Encoding": "chunked"})
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    wire = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 100_000]), body[i : i + 100_000])
        for i in range(0, len(body), 100_000)
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(f"PUT {path} HTTP/1.1\r\n{head}\r\n".encode() + wire + b"0\r\n\r\n")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert s3.get_object(Bucket="conf", Key="chunked")["Body"].read() == body


def test_non_ascii_metadata_comes_back_as_s3_sends_it(server, s3):
    """Raw UTF-8 in a header (what a non-boto client sends) and an RFC 2047 encoded-word
    (what boto3 users must send) are the same text, returned as an encoded-word."""
    word = "=?UTF-8?B?" + base64.b64encode("héllo wörld".encode()).decode() + "?="
    s3.put_object(Bucket="conf", Key="meta-2047", Body=b"x", Metadata={"name": word})
    assert s3.head_object(Bucket="conf", Key="meta-2047")["Metadata"] == {"name": word}
    path = "/conf/meta-raw"
    # signed as the text, sent as its UTF-8 bytes: what botocore does with a non-ASCII header
    headers: dict = signed_headers(
        server.url + path, "PUT", b"x", {"x-amz-meta-name": "héllo wörld"}
    )
    headers["x-amz-meta-name"] = "héllo wörld".encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("PUT", path, body=b"x", headers=headers)
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    assert s3.head_object(Bucket="conf", Key="meta-raw")["Metadata"] == {"name": word}


@pytest.mark.parametrize(
    "method, path",
    [
        ("DELETE", "/conf?location"),
        ("DELETE", "/conf?uploads"),
        ("PUT", "/conf?delete"),
        ("DELETE", "/conf/{key}?partNumber=1"),
        ("PUT", "/conf/{key}?uploads"),
        ("PUT", "/conf/{key}?delete"),
        ("POST", "/conf/{key}"),
    ],
)
def test_a_served_selector_on_the_wrong_operation_changes_nothing(server, s3, method, path):
    """S3 routes on method + path + selector together: a selector this server knows, sent
    with a method it does not go with, is not the plain DeleteBucket/PutObject/DeleteObject."""
    key = "selector-" + method + path.replace("/", "_").replace("?", "_").replace("=", "_")
    s3.put_object(Bucket="conf", Key=key, Body=BODY)
    path = path.format(key=key)
    headers = signed_headers(server.url + path, method, b"junk")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=b"junk", headers=headers)
        resp = conn.getresponse()
        assert (resp.status, b"<Code>NotImplemented</Code>" in resp.read()) == (501, True)
    finally:
        conn.close()
    intact(s3, key)
