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
