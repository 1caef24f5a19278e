"""S3 never acts on a broken precondition, and never accepts what it would not apply
(issue 38), checked with boto3 against a real ``shipyard server`` process: conditional
Complete, DeleteObject, DeleteObjects and CopyObject; racing conditional writes; headers
asking for features not served (501, nothing changed) beside what the SageMaker SDK sends by
default; 304s that name the version; stored checksums returned; a chunked upload's trailer
checked; SigV2 refused as S3 refuses it and a default boto3 presign working under
``shipyard server env``; a GET racing an overwrite serving one whole version."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import http.client
import os
import threading
import urllib.error
import urllib.request
import zlib

import pytest

BUCKET = "wcond"
BODY = b"weights" * 1000
PART = 5 << 20


@pytest.fixture(scope="module")
def s3(server):
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    client.create_bucket(Bucket=BUCKET)
    return client


def error_of(exc_info) -> tuple[int, str]:
    response = exc_info.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def body_of(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def missing(s3, key: str) -> bool:
    try:
        s3.head_object(Bucket=BUCKET, Key=key)
    except s3.exceptions.ClientError as err:
        return err.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    return False


def with_headers(s3, operation: str, headers: dict[str, str]):
    """A client call that also sends ``headers`` (what botocore's model cannot say)."""

    def add(request, **_):
        for name, value in headers.items():
            request.headers[name] = value

    event = f"before-sign.s3.{operation}"
    s3.meta.events.register(event, add)
    return lambda: s3.meta.events.unregister(event, add)


# -- 1. preconditions on every write and delete ---------------------------------------------
def _upload(s3, key: str) -> tuple[str, list[dict]]:
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    etag = s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=b"new")
    return upload, [{"PartNumber": 1, "ETag": etag["ETag"]}]


def test_complete_multipart_upload_honours_if_none_match_and_if_match(s3):
    old = s3.put_object(Bucket=BUCKET, Key="mpu/obj", Body=BODY)["ETag"]
    upload, parts = _upload(s3, "mpu/obj")
    complete = {"Bucket": BUCKET, "Key": "mpu/obj", "UploadId": upload}
    for kwargs in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef0123456789abcdef"'}):
        with pytest.raises(s3.exceptions.ClientError) as info:
            s3.complete_multipart_upload(**complete, MultipartUpload={"Parts": parts}, **kwargs)
        assert error_of(info) == (412, "PreconditionFailed"), kwargs
        assert body_of(s3, "mpu/obj") == BODY  # not overwritten
    assert len(s3.list_parts(**complete)["Parts"]) == 1  # the upload is kept, as S3 keeps it
    s3.complete_multipart_upload(**complete, MultipartUpload={"Parts": parts}, IfMatch=old)
    assert body_of(s3, "mpu/obj") == b"new"
    upload, parts = _upload(s3, "mpu/absent")
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.complete_multipart_upload(
            Bucket=BUCKET,
            Key="mpu/absent",
            UploadId=upload,
            MultipartUpload={"Parts": parts},
            IfMatch=old,
        )
    assert error_of(info) == (404, "NoSuchKey") and missing(s3, "mpu/absent")


def test_delete_object_honours_if_match_size_and_time(s3):
    etag = s3.put_object(Bucket=BUCKET, Key="del/obj", Body=BODY)["ETag"]
    modified = s3.head_object(Bucket=BUCKET, Key="del/obj")["LastModified"]
    for kwargs in (
        {"IfMatch": '"0123456789abcdef0123456789abcdef"'},
        {"IfMatchSize": len(BODY) + 1},
        {"IfMatch": etag, "IfMatchSize": 1},
    ):
        with pytest.raises(s3.exceptions.ClientError) as info:
            s3.delete_object(Bucket=BUCKET, Key="del/obj", **kwargs)
        assert error_of(info) == (412, "PreconditionFailed"), kwargs
        assert body_of(s3, "del/obj") == BODY
    undo = with_headers(s3, "DeleteObject", {"If-None-Match": "*"})
    try:
        with pytest.raises(s3.exceptions.ClientError) as info:
            s3.delete_object(Bucket=BUCKET, Key="del/obj", IfMatch=etag)
    finally:
        undo()
    assert error_of(info) == (501, "NotImplemented") and body_of(s3, "del/obj") == BODY
    s3.delete_object(
        Bucket=BUCKET,
        Key="del/obj",
        IfMatch=etag,
        IfMatchSize=len(BODY),
        IfMatchLastModifiedTime=modified,
    )
    assert missing(s3, "del/obj")
    s3.put_object(Bucket=BUCKET, Key="del/any", Body=BODY)
    s3.delete_object(Bucket=BUCKET, Key="del/any", IfMatch="*")
    assert missing(s3, "del/any")


def test_delete_objects_deletes_only_entries_whose_etag_matches(s3):
    good = s3.put_object(Bucket=BUCKET, Key="batch/good", Body=b"good")["ETag"]
    s3.put_object(Bucket=BUCKET, Key="batch/bad", Body=b"bad")
    s3.put_object(Bucket=BUCKET, Key="batch/plain", Body=b"plain")
    objects = [
        {"Key": "batch/good", "ETag": good},
        {"Key": "batch/bad", "ETag": '"0123456789abcdef0123456789abcdef"'},
        {"Key": "batch/plain"},
    ]
    answer = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": objects})
    assert sorted(d["Key"] for d in answer["Deleted"]) == ["batch/good", "batch/plain"]
    assert [(e["Key"], e["Code"]) for e in answer["Errors"]] == [
        ("batch/bad", "PreconditionFailed")
    ]
    assert body_of(s3, "batch/bad") == b"bad" and missing(s3, "batch/good")
    quiet = s3.delete_objects(
        Bucket=BUCKET, Delete={"Objects": [objects[1]], "Quiet": True}
    )  # a refusal is reported even when quiet
    assert [e["Key"] for e in quiet["Errors"]] == ["batch/bad"]
    assert body_of(s3, "batch/bad") == b"bad"


def test_copy_object_honours_the_destinations_conditions(s3):
    s3.put_object(Bucket=BUCKET, Key="copy/src", Body=b"source")
    dst = s3.put_object(Bucket=BUCKET, Key="copy/dst", Body=BODY)["ETag"]
    source = {"Bucket": BUCKET, "Key": "copy/src"}
    for kwargs in ({"IfMatch": '"0123456789abcdef0123456789abcdef"'}, {"IfNoneMatch": "*"}):
        with pytest.raises(s3.exceptions.ClientError) as info:
            s3.copy_object(Bucket=BUCKET, Key="copy/dst", CopySource=source, **kwargs)
        assert error_of(info) == (412, "PreconditionFailed"), kwargs
        assert body_of(s3, "copy/dst") == BODY
    s3.copy_object(Bucket=BUCKET, Key="copy/dst", CopySource=source, IfMatch=dst)
    assert body_of(s3, "copy/dst") == b"source"
    s3.copy_object(Bucket=BUCKET, Key="copy/new", CopySource=source, IfNoneMatch="*")
    assert body_of(s3, "copy/new") == b"source"


def test_racing_conditional_writes_let_exactly_one_win(s3):
    """The check and the write are one transaction: of 8 writers that all saw the same
    ETag (If-Match) or no object (If-None-Match: *), one succeeds, the others get 412."""
    import boto3
    from botocore.config import Config

    etag = s3.put_object(Bucket=BUCKET, Key="race/match", Body=b"v0")["ETag"]
    barrier = threading.Barrier(8)
    clients = [boto3.client("s3", config=Config(retries={"max_attempts": 1})) for _ in range(8)]

    def write(n: int, key: str, condition: dict) -> int:
        barrier.wait()
        try:
            clients[n].put_object(Bucket=BUCKET, Key=key, Body=b"%d" % n * 100000, **condition)
        except clients[n].exceptions.ClientError as err:
            return err.response["ResponseMetadata"]["HTTPStatusCode"]
        return 200

    for key, condition in (("race/match", {"IfMatch": etag}), ("race/new", {"IfNoneMatch": "*"})):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = sorted(pool.map(write, range(8), [key] * 8, [condition] * 8))
        assert codes == [200] + [412] * 7, (key, codes)
        barrier.reset()


# -- 2. what is not served is refused, what the SDK sends by default is not -----------------
NOT_SERVED = {
    "storage class": {"StorageClass": "GLACIER"},
    "website redirect": {"WebsiteRedirectLocation": "/elsewhere"},
    "tagging": {"Tagging": "team=ml"},
    "object lock": {
        "ObjectLockMode": "GOVERNANCE",
        "ObjectLockRetainUntilDate": "2031-01-01T00:00:00Z",
    },
    "legal hold": {"ObjectLockLegalHoldStatus": "ON"},
    "SSE-C": {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32},
    "a KMS key": {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/mine"},
}


@pytest.mark.parametrize("what", sorted(NOT_SERVED))
def test_a_write_asking_for_what_is_not_served_is_refused_and_changes_nothing(s3, what):
    key = f"ns/{what}"
    s3.put_object(Bucket=BUCKET, Key=key, Body=BODY)
    calls = (
        lambda: s3.put_object(Bucket=BUCKET, Key=key, Body=b"other", **NOT_SERVED[what]),
        lambda: s3.create_multipart_upload(Bucket=BUCKET, Key=key, **NOT_SERVED[what]),
        lambda: s3.copy_object(
            Bucket=BUCKET,
            Key=key,
            CopySource={"Bucket": BUCKET, "Key": "ns/src"},
            **NOT_SERVED[what],
        ),
    )
    s3.put_object(Bucket=BUCKET, Key="ns/src", Body=b"src")
    for call in calls:
        with pytest.raises(s3.exceptions.ClientError) as info:
            call()
        assert error_of(info) == (501, "NotImplemented"), what
        assert body_of(s3, key) == BODY
    uploads = s3.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", [])
    assert uploads == []


def test_a_bucket_with_object_lock_is_refused_and_not_created(s3):
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.create_bucket(Bucket="wcond-locked", ObjectLockEnabledForBucket=True)
    assert error_of(info) == (501, "NotImplemented")
    assert "wcond-locked" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_what_the_sagemaker_sdk_and_transfer_manager_send_by_default_is_accepted(s3, tmp_path):
    """The SDK uploads every code bundle with ServerSideEncryption=aws:kms (its
    encrypt_repacked_artifacts default), through boto3's transfer manager."""
    from boto3.s3.transfer import TransferConfig

    big = tmp_path / "sourcedir.tar.gz"
    big.write_bytes(os.urandom(PART + 1))
    config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
    for extra in ({"ServerSideEncryption": "aws:kms"}, {"ServerSideEncryption": "AES256"}):
        s3.upload_file(str(big), BUCKET, "sdk/sourcedir.tar.gz", ExtraArgs=extra, Config=config)
        assert body_of(s3, "sdk/sourcedir.tar.gz") == big.read_bytes()
    s3.put_object(Bucket=BUCKET, Key="sdk/std", Body=b"x", StorageClass="STANDARD")
    assert body_of(s3, "sdk/std") == b"x"


# -- 3. 304s name the version; checksums come back where asked ------------------------------
def test_a_304_carries_the_etag_and_last_modified(s3):
    etag = s3.put_object(Bucket=BUCKET, Key="nm/obj", Body=b"body")["ETag"]
    modified = s3.head_object(Bucket=BUCKET, Key="nm/obj")["ResponseMetadata"]["HTTPHeaders"][
        "last-modified"
    ]
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(s3.exceptions.ClientError) as info:
            call(Bucket=BUCKET, Key="nm/obj", IfNoneMatch=etag)
        assert error_of(info)[0] == 304
        headers = info.value.response["ResponseMetadata"]["HTTPHeaders"]
        assert headers["etag"] == etag and headers["last-modified"] == modified


def test_checksums_are_returned_when_asked(s3):
    sha = base64.b64encode(hashlib.sha256(BODY).digest()).decode()
    crc = base64.b64encode(zlib.crc32(BODY).to_bytes(4, "big")).decode()
    s3.put_object(Bucket=BUCKET, Key="ck/sha", Body=BODY, ChecksumAlgorithm="SHA256")
    s3.put_object(Bucket=BUCKET, Key="ck/crc", Body=BODY, ChecksumAlgorithm="CRC32")
    for call in (s3.get_object, s3.head_object):
        assert call(Bucket=BUCKET, Key="ck/sha", ChecksumMode="ENABLED")["ChecksumSHA256"] == sha
        assert call(Bucket=BUCKET, Key="ck/crc", ChecksumMode="ENABLED")["ChecksumCRC32"] == crc
    copied = s3.copy_object(
        Bucket=BUCKET, Key="ck/copy", CopySource={"Bucket": BUCKET, "Key": "ck/sha"}
    )
    assert copied["CopyObjectResult"]["ETag"]
    assert (
        s3.head_object(Bucket=BUCKET, Key="ck/copy", ChecksumMode="ENABLED")["ChecksumSHA256"]
        == sha
    )
    ranged = s3.get_object(Bucket=BUCKET, Key="ck/sha", Range="bytes=0-9", ChecksumMode="ENABLED")
    assert "ChecksumSHA256" not in ranged  # a part of the object has no whole checksum


def test_a_wrong_checksum_in_a_chunked_trailer_is_refused(server):
    """An aws-chunked body's checksum comes after it (x-amz-trailer): read and checked."""
    data = b"trailer" * 100
    good = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    for checksum, expected in (("AAAAAA==", 400), (good, 200)):
        body = (
            f"{len(data):x}\r\n".encode()
            + data
            + f"\r\n0\r\nx-amz-checksum-crc32:{checksum}\r\n\r\n".encode()
        )
        headers = {
            "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(data)),
            "x-amz-trailer": "x-amz-checksum-crc32",
        }
        url = f"{server.url}/{BUCKET}/trailer/{expected}"
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("PUT", url, body=body, headers=_trailer_signed(url, body, headers))
        answer = conn.getresponse()
        text = answer.read()
        conn.close()
        assert answer.status == expected, text
        if expected == 400:
            assert b"BadDigest" in text


def _trailer_signed(url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
    """Signed as botocore signs an upload whose checksum is a trailer: the payload is
    STREAMING-UNSIGNED-PAYLOAD-TRAILER, the chunks themselves unsigned."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="PUT", url=url, data=body, headers=headers)
    request.context["checksum"] = {"request_algorithm": {"in": "trailer"}}
    creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    S3SigV4Auth(creds, "s3", os.environ.get("AWS_DEFAULT_REGION", "us-east-1")).add_auth(request)
    out = dict(request.headers.items())
    out["Host"] = url.split("/")[2]
    return out


# -- 4. SigV2 refused as S3 refuses it; default presigns are SigV4 ---------------------------
def test_sigv2_is_refused_with_s3s_error_and_the_default_presign_works(s3):
    import boto3
    from botocore.config import Config

    s3.put_object(Bucket=BUCKET, Key="sig/obj", Body=b"signed")
    v2 = boto3.client("s3", config=Config(signature_version="s3"))
    for url in (
        v2.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "sig/obj"}),
    ):
        assert "AWSAccessKeyId=" in url
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url, timeout=30)
        text = info.value.read().decode()
        assert info.value.code == 400 and "<Code>InvalidRequest</Code>" in text
        assert "Please use AWS4-HMAC-SHA256." in text
    with pytest.raises(v2.exceptions.ClientError) as info:
        v2.get_object(Bucket=BUCKET, Key="sig/obj")  # header-signed with SigV2
    assert error_of(info) == (400, "InvalidRequest")
    default = boto3.client("s3")  # what a notebook makes after `eval "$(shipyard server env)"`
    url = default.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "sig/obj"})
    assert "X-Amz-Signature=" in url
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.read() == b"signed"


# -- 5. a GET serves one whole version ------------------------------------------------------
def test_a_get_racing_overwrites_and_deletes_serves_one_whole_version(s3):
    import boto3

    versions = {bytes([65 + n]) * ((1 << 20) + n * 65536) for n in range(3)}
    s3.put_object(Bucket=BUCKET, Key="race/get", Body=next(iter(versions)))
    stop = threading.Event()

    def churn() -> None:
        writer = boto3.client("s3")
        while not stop.is_set():
            for body in versions:
                writer.put_object(Bucket=BUCKET, Key="race/get", Body=body)
            writer.delete_object(Bucket=BUCKET, Key="race/get")

    thread = threading.Thread(target=churn)
    thread.start()
    broken = []
    try:
        for _ in range(120):
            try:
                got = s3.get_object(Bucket=BUCKET, Key="race/get")
                body = got["Body"].read()
            except s3.exceptions.NoSuchKey:
                continue
            except Exception as exc:  # noqa: BLE001 - a broken-off body is what is counted
                broken.append(repr(exc)[:200])
                continue
            if body not in versions or got["ETag"].strip('"') != hashlib.md5(body).hexdigest():
                broken.append(f"{len(body)} bytes that are not one version")
    finally:
        stop.set()
        thread.join()
    assert broken == []
