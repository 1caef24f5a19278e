"""Multipart uploads keep checksums as S3 does (issue 38), checked with boto3 against a real
``shipyard server``, every checksum recomputed here from the parts' bytes (hashlib, zlib):

- CreateMultipartUpload's ``ChecksumAlgorithm`` (and ``ChecksumType``) is kept and answered;
  each part's checksum is kept (UploadPart, ListParts); a re-uploaded part's replaces it;
- CompleteMultipartUpload answers the object's checksum: COMPOSITE ``base64(H(H(p1) +
  H(p2)...))-N`` for SHA256/SHA1/CRC32, FULL_OBJECT CRC32 of all the bytes; it checks the
  listed parts' checksums (``InvalidPart``), requires them for a COMPOSITE upload (S3's
  ``InvalidRequest``) and checks a whole-object checksum sent with it (``BadDigest``);
- HeadObject/GetObject with ``ChecksumMode=ENABLED`` answer it (and a part's own for
  ``PartNumber``); GetObjectAttributes answers Checksum and ObjectParts (paged);
- boto3's transfer manager (CRC32 by default) round-trips a multipart file;
- a store written by the version before (``uploads`` without its ``checksum`` column, a
  bare list of part sizes beside a multipart object) opens and serves, and an upload it had
  in progress completes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sqlite3
import time
import zlib

import pytest

from tests.integration.server.conftest import ServerProcess, client_env, free_port

BUCKET = "mpck"
PART = 5 << 20


@pytest.fixture(scope="module")
def s3(server):
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    client.create_bucket(Bucket=BUCKET)
    return client


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def sha256(data: bytes) -> str:
    return b64(hashlib.sha256(data).digest())


def crc32(data: bytes) -> str:
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def composite(algorithm: str, parts: list[bytes]) -> str:
    """S3's COMPOSITE checksum, computed independently of the server's code."""
    if algorithm == "crc32":
        joined = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
        return b64(zlib.crc32(joined).to_bytes(4, "big")) + f"-{len(parts)}"
    joined = b"".join(hashlib.new(algorithm, p).digest() for p in parts)
    return b64(hashlib.new(algorithm, joined).digest()) + f"-{len(parts)}"


def error_of(exc_info) -> tuple[int, str, str]:
    response = exc_info.value.response
    return (
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Code"],
        response["Error"].get("Message", ""),
    )


BODIES = [b"A" * PART, b"B" * 1000 + os.urandom(3000)]


def _upload(s3, key: str, algorithm: str = "SHA256", kind: str | None = None) -> str:
    extra = {"ChecksumType": kind} if kind else {}
    created = s3.create_multipart_upload(
        Bucket=BUCKET, Key=key, ChecksumAlgorithm=algorithm, **extra
    )
    assert created["ChecksumAlgorithm"] == algorithm
    assert created["ChecksumType"] == (kind or "COMPOSITE")
    return created["UploadId"]


def _put_parts(s3, key: str, upload: str, algorithm: str = "SHA256") -> list[dict]:
    member = "Checksum" + algorithm
    listed = []
    for number, body in enumerate(BODIES, 1):
        answer = s3.upload_part(
            Bucket=BUCKET,
            Key=key,
            UploadId=upload,
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm=algorithm,
        )
        listed.append({"PartNumber": number, "ETag": answer["ETag"], member: answer[member]})
    return listed


def test_a_sha256_upload_keeps_part_and_composite_checksums(s3):
    key = "sha/obj"
    upload = _upload(s3, key)
    listed = _put_parts(s3, key, upload)
    assert [p["ChecksumSHA256"] for p in listed] == [sha256(b) for b in BODIES]
    page = s3.list_parts(Bucket=BUCKET, Key=key, UploadId=upload)
    assert page["ChecksumAlgorithm"] == "SHA256"
    assert [p["ChecksumSHA256"] for p in page["Parts"]] == [sha256(b) for b in BODIES]

    done = s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": listed}
    )
    want = composite("sha256", BODIES)
    assert done["ChecksumSHA256"] == want and done["ChecksumType"] == "COMPOSITE"

    assert "ChecksumSHA256" not in s3.head_object(Bucket=BUCKET, Key=key)
    head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == want and head["ChecksumType"] == "COMPOSITE"
    got = s3.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert got["ChecksumSHA256"] == want
    assert got["Body"].read() == b"".join(BODIES)
    part = s3.get_object(Bucket=BUCKET, Key=key, PartNumber=2, ChecksumMode="ENABLED")
    assert part["ChecksumSHA256"] == sha256(BODIES[1]) and part["ChecksumType"] == "COMPOSITE"
    assert part["Body"].read() == BODIES[1]

    attrs = s3.get_object_attributes(
        Bucket=BUCKET,
        Key=key,
        ObjectAttributes=["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"],
    )
    assert attrs["ETag"] == done["ETag"].strip('"')
    assert attrs["ObjectSize"] == sum(map(len, BODIES)) and attrs["StorageClass"] == "STANDARD"
    assert attrs["Checksum"] == {"ChecksumSHA256": want, "ChecksumType": "COMPOSITE"}
    parts = attrs["ObjectParts"]
    assert parts["TotalPartsCount"] == 2 and parts["IsTruncated"] is False
    assert [(p["PartNumber"], p["Size"], p["ChecksumSHA256"]) for p in parts["Parts"]] == [
        (n, len(b), sha256(b)) for n, b in enumerate(BODIES, 1)
    ]
    paged = s3.get_object_attributes(
        Bucket=BUCKET, Key=key, ObjectAttributes=["ObjectParts"], MaxParts=1
    )["ObjectParts"]
    assert [p["PartNumber"] for p in paged["Parts"]] == [1] and paged["IsTruncated"] is True
    rest = s3.get_object_attributes(
        Bucket=BUCKET, Key=key, ObjectAttributes=["ObjectParts"], PartNumberMarker=1
    )["ObjectParts"]
    assert [p["PartNumber"] for p in rest["Parts"]] == [2] and rest["IsTruncated"] is False
    # a repeated Complete answers the same object and checksum
    again = s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": listed}
    )
    assert (again["ETag"], again["ChecksumSHA256"]) == (done["ETag"], want)


def test_a_reuploaded_part_replaces_its_checksum(s3):
    key = "sha/reup"
    upload = _upload(s3, key)
    listed = _put_parts(s3, key, upload)
    stale = listed[1]["ChecksumSHA256"]
    new_body = b"C" * 2000
    answer = s3.upload_part(
        Bucket=BUCKET,
        Key=key,
        UploadId=upload,
        PartNumber=2,
        Body=new_body,
        ChecksumAlgorithm="SHA256",
    )
    assert answer["ChecksumSHA256"] == sha256(new_body)
    listed[1] = {"PartNumber": 2, "ETag": answer["ETag"], "ChecksumSHA256": stale}
    with pytest.raises(s3.exceptions.ClientError) as info:  # the replaced part's checksum
        s3.complete_multipart_upload(
            Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": listed}
        )
    assert error_of(info)[:2] == (400, "InvalidPart")
    assert stale in error_of(info)[2]
    listed[1]["ChecksumSHA256"] = answer["ChecksumSHA256"]
    done = s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": listed}
    )
    assert done["ChecksumSHA256"] == composite("sha256", [BODIES[0], new_body])


def test_complete_checks_what_it_is_sent_and_keeps_the_upload_when_refused(s3):
    key = "sha/refused"
    upload = _upload(s3, key)
    listed = _put_parts(s3, key, upload)
    bare = [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in listed]
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.complete_multipart_upload(
            Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": bare}
        )
    assert error_of(info) == (
        400,
        "InvalidRequest",
        "The upload was created using a sha256 checksum. The complete request must include "
        "the checksum for each part. It was missing for part 1 in the request.",
    )
    wrong = sha256(b"not the object") + "-2"
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.complete_multipart_upload(
            Bucket=BUCKET,
            Key=key,
            UploadId=upload,
            ChecksumSHA256=wrong,
            MultipartUpload={"Parts": listed},
        )
    assert error_of(info)[:2] == (400, "BadDigest")
    with pytest.raises(s3.exceptions.ClientError):
        s3.head_object(Bucket=BUCKET, Key=key)  # nothing written
    right = composite("sha256", BODIES)
    done = s3.complete_multipart_upload(
        Bucket=BUCKET,
        Key=key,
        UploadId=upload,
        ChecksumSHA256=right,
        MultipartUpload={"Parts": listed},
    )
    assert done["ChecksumSHA256"] == right


def test_a_crc32_full_object_upload_has_the_whole_objects_crc(s3):
    key = "crc/full"
    upload = _upload(s3, key, "CRC32", "FULL_OBJECT")
    listed = _put_parts(s3, key, upload, "CRC32")
    assert [p["ChecksumCRC32"] for p in listed] == [crc32(b) for b in BODIES]
    done = s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": listed}
    )
    whole = crc32(b"".join(BODIES))
    assert done["ChecksumCRC32"] == whole and done["ChecksumType"] == "FULL_OBJECT"
    got = s3.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")  # botocore checks it
    assert got["ChecksumCRC32"] == whole and got["ChecksumType"] == "FULL_OBJECT"
    assert got["Body"].read() == b"".join(BODIES)


def test_sha1_composite_and_the_types_s3_refuses(s3):
    key = "sha1/obj"
    upload = _upload(s3, key, "SHA1")
    listed = _put_parts(s3, key, upload, "SHA1")
    done = s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": listed}
    )
    assert done["ChecksumSHA1"] == composite("sha1", BODIES)
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.create_multipart_upload(
            Bucket=BUCKET, Key="sha1/full", ChecksumAlgorithm="SHA256", ChecksumType="FULL_OBJECT"
        )
    assert error_of(info)[:2] == (400, "InvalidRequest")


def test_boto3_transfer_manager_round_trips_a_multipart_file(s3, tmp_path):
    """upload_fileobj over its threshold: CRC32 on create, each part and the Complete (the
    SDK's default), as SageMaker's uploads of big artifacts send them."""
    from boto3.s3.transfer import TransferConfig

    data = os.urandom(PART) + os.urandom(PART // 2)
    config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
    s3.upload_fileobj(io.BytesIO(data), BUCKET, "tm/file", Config=config)
    head = s3.head_object(Bucket=BUCKET, Key="tm/file", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == composite("crc32", [data[:PART], data[PART:]])
    out = io.BytesIO()
    s3.download_fileobj(BUCKET, "tm/file", out)
    assert out.getvalue() == data


def test_get_object_attributes_of_a_plain_object(s3):
    body = b"A" * 1024
    put = s3.put_object(Bucket=BUCKET, Key="plain", Body=body, ChecksumSHA256=sha256(body))
    attrs = s3.get_object_attributes(
        Bucket=BUCKET,
        Key="plain",
        ObjectAttributes=["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"],
    )
    assert attrs["ETag"] == put["ETag"].strip('"') and attrs["ObjectSize"] == 1024
    assert attrs["Checksum"]["ChecksumSHA256"] == sha256(body)
    assert "ObjectParts" not in attrs
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object_attributes(Bucket=BUCKET, Key="absent", ObjectAttributes=["ETag"])


# -- a store from the version before -----------------------------------------------------------
OLD_SCHEMA = """
CREATE TABLE buckets (name TEXT PRIMARY KEY, region TEXT, created REAL);
CREATE TABLE objects (
    bucket TEXT NOT NULL, key BLOB NOT NULL, file TEXT NOT NULL, size INTEGER NOT NULL,
    etag TEXT NOT NULL, modified REAL NOT NULL, content_type TEXT, meta TEXT,
    PRIMARY KEY (bucket, key)
);
CREATE TABLE uploads (
    id TEXT PRIMARY KEY, bucket TEXT NOT NULL, key BLOB NOT NULL, content_type TEXT,
    meta TEXT, created REAL
);
CREATE TABLE completed (
    id TEXT PRIMARY KEY, bucket TEXT NOT NULL, key BLOB NOT NULL, etag TEXT NOT NULL,
    created REAL
);
"""


def _old_store(root: str) -> tuple[bytes, bytes]:
    """What the previous version left: a multipart object (two parts, a bare list of part
    sizes beside it) and an upload in progress with one part."""
    for sub in ("data/ab", "uploads/old-upload", "tmp"):
        os.makedirs(os.path.join(root, sub))
    first, second = b"1" * PART, b"2" * 100
    obj = os.path.join(root, "data", "ab", "abcdef")
    with open(obj, "wb") as fh:
        fh.write(first + second)
    with open(obj + ".parts", "w") as fh:
        json.dump([len(first), len(second)], fh)
    etag = hashlib.md5(hashlib.md5(first).digest() + hashlib.md5(second).digest()).hexdigest()
    part = b"in progress" * 10
    with open(os.path.join(root, "uploads", "old-upload", "00001"), "wb") as fh:
        fh.write(part)
    with open(os.path.join(root, "uploads", "old-upload", "00001.md5"), "w") as fh:
        fh.write(hashlib.md5(part).hexdigest())
    db = sqlite3.connect(os.path.join(root, "index.db"))
    db.executescript(OLD_SCHEMA)
    now = time.time()
    db.execute("INSERT INTO buckets VALUES (?,?,?)", ("old", "us-east-1", now))
    db.execute(
        "INSERT INTO objects VALUES (?,?,?,?,?,?,?,?)",
        ("old", b"mp", obj, PART + 100, f"{etag}-2", now, None, "{}"),
    )
    db.execute(
        "INSERT INTO uploads VALUES (?,?,?,?,?,?)", ("old-upload", "old", b"up", None, "{}", now)
    )
    db.commit()
    db.close()
    return first + second, part


def test_a_store_from_the_version_before_opens_and_serves(tmp_path):
    import boto3
    from botocore.config import Config

    home = str(tmp_path / "home")
    os.makedirs(home, mode=0o700)
    whole, part = _old_store(os.path.join(home, "s3"))
    port = free_port()
    proc = ServerProcess(home, port).start()
    try:
        env = os.environ | client_env(home, port)  # the names it leaves alone are ours
        s3 = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}),
        )
        assert s3.get_object(Bucket="old", Key="mp")["Body"].read() == whole
        second = s3.get_object(Bucket="old", Key="mp", PartNumber=2)
        assert second["Body"].read() == whole[PART:] and second["PartsCount"] == 2
        attrs = s3.get_object_attributes(
            Bucket="old", Key="mp", ObjectAttributes=["ObjectParts", "Checksum", "ObjectSize"]
        )
        assert [p["Size"] for p in attrs["ObjectParts"]["Parts"]] == [PART, 100]
        assert "Checksum" not in attrs and attrs["ObjectSize"] == len(whole)
        # the upload in progress: listed as before, completed with a checksum it never kept
        parts = s3.list_parts(Bucket="old", Key="up", UploadId="old-upload")["Parts"]
        assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, len(part))]
        done = s3.complete_multipart_upload(
            Bucket="old",
            Key="up",
            UploadId="old-upload",
            MultipartUpload={
                "Parts": [{"PartNumber": 1, "ETag": parts[0]["ETag"], "ChecksumCRC32": crc32(part)}]
            },
        )
        assert "ChecksumCRC32" not in done
        assert s3.get_object(Bucket="old", Key="up")["Body"].read() == part
        # and a new upload on the migrated store keeps its checksum
        new = s3.create_multipart_upload(Bucket="old", Key="new", ChecksumAlgorithm="SHA256")
        answer = s3.upload_part(
            Bucket="old",
            Key="new",
            UploadId=new["UploadId"],
            PartNumber=1,
            Body=b"x",
            ChecksumAlgorithm="SHA256",
        )
        done = s3.complete_multipart_upload(
            Bucket="old",
            Key="new",
            UploadId=new["UploadId"],
            MultipartUpload={
                "Parts": [{"PartNumber": 1, "ETag": answer["ETag"], "ChecksumSHA256": sha256(b"x")}]
            },
        )
        assert done["ChecksumSHA256"] == composite("sha256", [b"x"])
    finally:
        proc.stop()
