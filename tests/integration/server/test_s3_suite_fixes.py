"""What ceph/s3-tests found different in the groups SageMaker users rely on (issue 38),
each checked with boto3 against a real ``shipyard server`` process: ListObjectVersions of a
bucket that is not versioned (every key's one version, ``null``), which tools that empty a
bucket call first (the suite's own cleanup, boto3's ``object_versions.delete()``)."""

from __future__ import annotations

import pytest

BUCKET = "suitefix"


@pytest.fixture(scope="module")
def s3(server):
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    client.create_bucket(Bucket=BUCKET)
    return client


def test_list_object_versions_of_an_unversioned_bucket(s3) -> None:
    bucket = "versions-list"
    s3.create_bucket(Bucket=bucket)
    for key in ("a", "b/1", "b/2", "c"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    page = s3.list_object_versions(Bucket=bucket, MaxKeys=2)
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in page["Versions"]] == [
        ("a", "null", True),
        ("b/1", "null", True),
    ]
    assert page["IsTruncated"] and page["NextKeyMarker"] == "b/1"
    rest = s3.list_object_versions(
        Bucket=bucket, KeyMarker=page["NextKeyMarker"], VersionIdMarker="null"
    )
    assert [v["Key"] for v in rest["Versions"]] == ["b/2", "c"]
    assert not rest["IsTruncated"]
    rolled = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [v["Key"] for v in rolled["Versions"]] == ["a", "c"]
    assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["b/"]
    size = s3.list_object_versions(Bucket=bucket, Prefix="c")["Versions"][0]["Size"]
    assert size == 1


def test_emptying_a_bucket_through_its_versions(s3) -> None:
    import boto3

    bucket = boto3.resource("s3").Bucket("versions-empty")
    bucket.create()
    for n in range(5):
        bucket.put_object(Key=f"k{n}", Body=b"x")
    bucket.object_versions.delete()
    bucket.delete()
    assert "versions-empty" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_a_version_marker_other_than_null_is_refused(s3) -> None:
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.list_object_versions(Bucket=BUCKET, KeyMarker="a", VersionIdMarker="3HL4kqtJ")
    assert info.value.response["Error"]["Code"] == "InvalidArgument"
    assert "null" in info.value.response["Error"]["Message"]


def error_of(exc_info) -> tuple[int, str]:
    response = exc_info.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def test_if_none_match_naming_an_etag_guards_a_put(s3) -> None:
    """``If-None-Match: <etag>`` on PutObject: refused (412, nothing written) when the object
    has that ETag, written otherwise; it was 501 for any value but ``*``."""
    etag = s3.put_object(Bucket=BUCKET, Key="inm", Body=b"one")["ETag"]
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket=BUCKET, Key="inm", Body=b"two", IfNoneMatch=etag)
    assert error_of(info) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=BUCKET, Key="inm")["Body"].read() == b"one"
    s3.put_object(Bucket=BUCKET, Key="inm", Body=b"three", IfNoneMatch='"0badetag"')
    assert s3.get_object(Bucket=BUCKET, Key="inm")["Body"].read() == b"three"
    s3.put_object(Bucket=BUCKET, Key="inm-new", Body=b"x", IfNoneMatch=etag)  # no object yet
    assert s3.get_object(Bucket=BUCKET, Key="inm-new")["Body"].read() == b"x"


def test_a_conditional_delete_of_a_missing_key_is_204(s3) -> None:
    """S3's DeleteObject: "if the ETag matches or if the object doesn't exist, 204"; it was
    404 NoSuchKey, which failed cleanups that delete conditionally and retry."""
    for kwargs in ({"IfMatch": "*"}, {"IfMatch": '"0badetag"'}, {"IfMatchSize": 3}):
        answer = s3.delete_object(Bucket=BUCKET, Key="never-written", **kwargs)
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 204
    s3.put_object(Bucket=BUCKET, Key="cdel", Body=b"abc")
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.delete_object(Bucket=BUCKET, Key="cdel", IfMatch='"0badetag"')
    assert error_of(info) == (412, "PreconditionFailed")
    s3.delete_object(Bucket=BUCKET, Key="cdel", IfMatchSize=3)
    with pytest.raises(s3.exceptions.ClientError):
        s3.head_object(Bucket=BUCKET, Key="cdel")


def test_delete_objects_takes_botocores_last_modified_time(s3) -> None:
    """DeleteObjects' per-object ``LastModifiedTime`` as botocore sends it (an HTTP date,
    the model's rfc822 format): it was refused as MalformedXML."""
    import datetime as dt

    s3.put_object(Bucket=BUCKET, Key="lmt", Body=b"x")
    mtime = s3.head_object(Bucket=BUCKET, Key="lmt")["LastModified"]
    stale = dt.datetime(2015, 1, 1, tzinfo=dt.timezone.utc)
    answer = s3.delete_objects(
        Bucket=BUCKET, Delete={"Objects": [{"Key": "lmt", "LastModifiedTime": stale}]}
    )
    assert [e["Code"] for e in answer["Errors"]] == ["PreconditionFailed"]
    answer = s3.delete_objects(
        Bucket=BUCKET, Delete={"Objects": [{"Key": "lmt", "LastModifiedTime": mtime}]}
    )
    assert [d["Key"] for d in answer["Deleted"]] == ["lmt"]


def test_a_one_part_multipart_object_answers_its_parts_count(s3) -> None:
    """GET/HEAD ?partNumber=1 of a multipart object of one part names ``PartsCount`` (1) as
    S3 does; it was left out (only objects of several parts had it), and a downloader that
    fetches parts by number (``PartsCount`` from part 1) stopped at KeyError."""
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="one-part")["UploadId"]
    etag = s3.upload_part(
        Bucket=BUCKET, Key="one-part", UploadId=upload, PartNumber=1, Body=b"p" * 1000
    )["ETag"]
    done = s3.complete_multipart_upload(
        Bucket=BUCKET,
        Key="one-part",
        UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]},
    )
    head = s3.head_object(Bucket=BUCKET, Key="one-part", PartNumber=1)
    assert head["PartsCount"] == 1 and head["ETag"] == done["ETag"]
    got = s3.get_object(Bucket=BUCKET, Key="one-part", PartNumber=1)
    assert got["PartsCount"] == 1 and got["Body"].read() == b"p" * 1000
    s3.put_object(Bucket=BUCKET, Key="single", Body=b"body")  # not multipart: the whole
    whole = s3.get_object(Bucket=BUCKET, Key="single", PartNumber=1)
    assert "PartsCount" not in whole and whole["Body"].read() == b"body"


def test_content_encoding_round_trips_as_sent(s3) -> None:
    """A Content-Encoding of several codings comes back as sent (it came back without the
    space: "deflate,gzip"), and ``aws-chunked``, the transfer's own, is dropped."""
    for sent, kept in (
        ("deflate, gzip", "deflate, gzip"),
        ("gzip, aws-chunked", "gzip"),
        ("aws-chunked, deflate, gzip", "deflate, gzip"),
    ):
        s3.put_object(Bucket=BUCKET, Key="enc", Body=b"x", ContentEncoding=sent)
        assert s3.head_object(Bucket=BUCKET, Key="enc")["ContentEncoding"] == kept


def test_list_buckets_in_pages(s3) -> None:
    """ListBuckets with ``MaxBuckets`` and a continuation token, as S3 pages it since 2024
    (boto3's list_buckets paginator sends them); ``max-buckets`` was 501."""
    for name in ("page-a", "page-b", "page-c"):
        s3.create_bucket(Bucket=name)
    first = s3.list_buckets(MaxBuckets=2, Prefix="page-")
    assert [b["Name"] for b in first["Buckets"]] == ["page-a", "page-b"]
    rest = s3.list_buckets(
        MaxBuckets=2, Prefix="page-", ContinuationToken=first["ContinuationToken"]
    )
    assert [b["Name"] for b in rest["Buckets"]] == ["page-c"] and "ContinuationToken" not in rest
    pages = s3.get_paginator("list_buckets").paginate(PaginationConfig={"PageSize": 1})
    assert {"page-a", "page-b", "page-c"} <= {b["Name"] for p in pages for b in p["Buckets"]}
