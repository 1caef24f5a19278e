"""S3's answers where the public conformance suite (ceph/s3-tests, see docs/s3-conformance.md)
found shipyard server different, each checked here with boto3 against a real server
process: listing pages and their echoes, conditional reads and writes, the standard headers
an object keeps, GetObject's response overrides, request ids on errors, multipart rules
(part sizes, a repeated Complete, UploadPartCopy's range) and a UTF-8 header's signature."""

from __future__ import annotations

import base64
import datetime as dt
import email.utils

import pytest

BUCKET = "semantics"


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


def http_date(when: float) -> str:
    return email.utils.formatdate(when, usegmt=True)


# -- listing --------------------------------------------------------------------------------
def test_max_keys_zero_is_an_empty_page_that_is_not_truncated(s3):
    for key in ("mk/a", "mk/b"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    v1 = s3.list_objects(Bucket=BUCKET, Prefix="mk/", MaxKeys=0)
    v2 = s3.list_objects_v2(Bucket=BUCKET, Prefix="mk/", MaxKeys=0)
    for page in (v1, v2):
        assert page["IsTruncated"] is False and "Contents" not in page


def test_v1_echoes_the_prefix_as_sent_and_v2_round_trips_it(s3):
    """botocore asks for encoding-type=url and decodes v2's Prefix but not v1's: S3 sends
    v1's as it came (a prefix with a newline came back as '%0A')."""
    s3.put_object(Bucket=BUCKET, Key="nl\nkey", Body=b"x")
    assert s3.list_objects(Bucket=BUCKET, Prefix="nl\n")["Prefix"] == "nl\n"
    page = s3.list_objects_v2(Bucket=BUCKET, Prefix="nl\n")
    assert page["Prefix"] == "nl\n" and [o["Key"] for o in page["Contents"]] == ["nl\nkey"]


def test_the_owner_is_listed_in_v1_and_in_v2_only_when_asked(s3):
    s3.put_object(Bucket=BUCKET, Key="own/a", Body=b"x")
    assert "Owner" in s3.list_objects(Bucket=BUCKET, Prefix="own/")["Contents"][0]
    assert "Owner" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="own/")["Contents"][0]
    fetched = s3.list_objects_v2(Bucket=BUCKET, Prefix="own/", FetchOwner=True)
    assert fetched["Contents"][0]["Owner"]["ID"]


# -- errors ---------------------------------------------------------------------------------
def test_an_error_names_the_request_id_its_header_carries(s3):
    seen: dict = {}
    s3.meta.events.register(
        "after-call.s3.GetObject", lambda http_response, **_: seen.update(body=http_response)
    )
    with pytest.raises(s3.exceptions.NoSuchKey) as info:
        s3.get_object(Bucket=BUCKET, Key="nobody-home")
    request_id = info.value.response["ResponseMetadata"]["RequestId"]
    assert request_id and f"<RequestId>{request_id}</RequestId>".encode() in seen["body"].content


# -- the headers an object keeps ------------------------------------------------------------
def test_standard_headers_are_kept_copied_and_replaced(s3):
    expires = dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    s3.put_object(
        Bucket=BUCKET,
        Key="hdr/src",
        Body=b"x",
        CacheControl="public, max-age=14400",
        ContentDisposition='attachment; filename="m.bin"',
        ContentEncoding="gzip",
        ContentLanguage="en",
        Expires=expires,
    )
    head = s3.head_object(Bucket=BUCKET, Key="hdr/src")
    assert head["CacheControl"] == "public, max-age=14400"
    assert head["ContentDisposition"] == 'attachment; filename="m.bin"'
    assert head["ContentEncoding"] == "gzip" and head["ContentLanguage"] == "en"
    assert head["Expires"] == expires
    source = {"Bucket": BUCKET, "Key": "hdr/src"}
    s3.copy_object(Bucket=BUCKET, Key="hdr/copied", CopySource=source)
    assert s3.head_object(Bucket=BUCKET, Key="hdr/copied")["CacheControl"] == head["CacheControl"]
    s3.copy_object(
        Bucket=BUCKET,
        Key="hdr/replaced",
        CopySource=source,
        MetadataDirective="REPLACE",
        CacheControl="no-store",
    )
    replaced = s3.head_object(Bucket=BUCKET, Key="hdr/replaced")
    assert replaced["CacheControl"] == "no-store" and "ContentEncoding" not in replaced


def test_get_object_response_overrides(s3):
    s3.put_object(Bucket=BUCKET, Key="hdr/plain", Body=b"x", ContentType="text/plain")
    got = s3.get_object(
        Bucket=BUCKET,
        Key="hdr/plain",
        ResponseContentType="application/octet-stream",
        ResponseContentDisposition="attachment",
        ResponseCacheControl="no-cache",
        ResponseContentLanguage="fr",
    )
    assert got["ContentType"] == "application/octet-stream"
    assert got["ContentDisposition"] == "attachment" and got["CacheControl"] == "no-cache"
    assert got["ContentLanguage"] == "fr"
    assert s3.head_object(Bucket=BUCKET, Key="hdr/plain")["ContentType"] == "text/plain"


# -- conditional requests ---------------------------------------------------------------------
def test_conditional_gets_and_heads(s3):
    etag = s3.put_object(Bucket=BUCKET, Key="cond/obj", Body=b"body")["ETag"]
    modified = s3.head_object(Bucket=BUCKET, Key="cond/obj")["LastModified"].timestamp()
    long_ago, later = http_date(modified - 86400), http_date(modified + 86400)
    get = s3.get_object
    assert get(Bucket=BUCKET, Key="cond/obj", IfMatch=etag)["Body"].read() == b"body"
    assert get(Bucket=BUCKET, Key="cond/obj", IfNoneMatch='"other"')["Body"].read() == b"body"
    assert get(Bucket=BUCKET, Key="cond/obj", IfModifiedSince=long_ago)["Body"].read()
    assert get(Bucket=BUCKET, Key="cond/obj", IfUnmodifiedSince=later)["Body"].read()
    for call, kwargs, answer in (
        (get, {"IfMatch": '"other"'}, (412, "PreconditionFailed")),
        (get, {"IfUnmodifiedSince": long_ago}, (412, "PreconditionFailed")),
        (get, {"IfNoneMatch": etag}, (304, "304")),
        (get, {"IfModifiedSince": later}, (304, "304")),
        (s3.head_object, {"IfNoneMatch": etag}, (304, "304")),
        (s3.head_object, {"IfMatch": '"other"'}, (412, "412")),
    ):
        with pytest.raises(s3.exceptions.ClientError) as info:
            call(Bucket=BUCKET, Key="cond/obj", **kwargs)
        assert error_of(info) == answer, kwargs
    # RFC 7232's order: a true If-Match outranks If-Unmodified-Since, a false If-None-Match
    # outranks If-Modified-Since
    both = get(Bucket=BUCKET, Key="cond/obj", IfMatch=etag, IfUnmodifiedSince=long_ago)
    assert both["Body"].read() == b"body"
    with pytest.raises(s3.exceptions.ClientError) as info:
        get(Bucket=BUCKET, Key="cond/obj", IfNoneMatch=etag, IfModifiedSince=long_ago)
    assert error_of(info)[0] == 304


def test_a_copy_checks_its_source_conditions(s3):
    etag = s3.put_object(Bucket=BUCKET, Key="cond/src", Body=b"src")["ETag"]
    source = {"Bucket": BUCKET, "Key": "cond/src"}
    for kwargs in (
        {"CopySourceIfMatch": '"other"'},
        {"CopySourceIfNoneMatch": etag},
        {"CopySourceIfUnmodifiedSince": dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)},
    ):
        with pytest.raises(s3.exceptions.ClientError) as info:
            s3.copy_object(Bucket=BUCKET, Key="cond/dst", CopySource=source, **kwargs)
        assert error_of(info) == (412, "PreconditionFailed"), kwargs
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.head_object(Bucket=BUCKET, Key="cond/dst")
    assert error_of(info)[0] == 404  # nothing was copied
    s3.copy_object(Bucket=BUCKET, Key="cond/dst", CopySource=source, CopySourceIfMatch=etag)
    assert s3.get_object(Bucket=BUCKET, Key="cond/dst")["Body"].read() == b"src"


def test_a_put_with_if_match_replaces_only_that_version(s3):
    etag = s3.put_object(Bucket=BUCKET, Key="cond/put", Body=b"one")["ETag"]
    s3.put_object(Bucket=BUCKET, Key="cond/put", Body=b"two", IfMatch=etag)
    assert s3.get_object(Bucket=BUCKET, Key="cond/put")["Body"].read() == b"two"
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket=BUCKET, Key="cond/put", Body=b"three", IfMatch=etag)
    assert error_of(info) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=BUCKET, Key="cond/put")["Body"].read() == b"two"
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.put_object(Bucket=BUCKET, Key="cond/none", Body=b"x", IfMatch=etag)
    assert error_of(info) == (404, "NoSuchKey")


# -- multipart -------------------------------------------------------------------------------
def _upload(s3, key: str, bodies: list[bytes]) -> tuple[str, list[dict]]:
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(
                Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=n, Body=body
            )["ETag"],
        }
        for n, body in enumerate(bodies, 1)
    ]
    return upload, parts


def test_parts_under_5_mib_but_the_last_are_entity_too_small(s3):
    upload, parts = _upload(s3, "mp/small", [b"a" * 1024, b"b" * 10])
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.complete_multipart_upload(
            Bucket=BUCKET, Key="mp/small", UploadId=upload, MultipartUpload={"Parts": parts}
        )
    assert error_of(info) == (400, "EntityTooSmall")
    listed = s3.list_parts(Bucket=BUCKET, Key="mp/small", UploadId=upload)["Parts"]
    assert [p["PartNumber"] for p in listed] == [1, 2]  # the upload is kept, as S3 keeps it
    s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/small", UploadId=upload)


def test_a_repeated_complete_answers_the_object_it_made(s3):
    bodies = [b"a" * (5 << 20), b"tail"]
    upload, parts = _upload(s3, "mp/again", bodies)
    done = {"Parts": parts}
    first = s3.complete_multipart_upload(
        Bucket=BUCKET, Key="mp/again", UploadId=upload, MultipartUpload=done
    )
    again = s3.complete_multipart_upload(
        Bucket=BUCKET, Key="mp/again", UploadId=upload, MultipartUpload=done
    )
    assert again["ETag"] == first["ETag"]
    assert s3.get_object(Bucket=BUCKET, Key="mp/again")["Body"].read() == b"".join(bodies)
    s3.put_object(Bucket=BUCKET, Key="mp/again", Body=b"newer")  # the upload's object is gone
    with pytest.raises(s3.exceptions.NoSuchUpload):
        s3.complete_multipart_upload(
            Bucket=BUCKET, Key="mp/again", UploadId=upload, MultipartUpload=done
        )
    assert s3.get_object(Bucket=BUCKET, Key="mp/again")["Body"].read() == b"newer"


def test_a_complete_with_a_part_number_that_is_not_a_number_is_malformed(server, s3):
    """(Sent without S3's XML namespace, as hand-written clients do; S3 reads it too.)"""
    import http.client

    from tests.integration.server.conftest import signed_headers

    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/bad")["UploadId"]
    body = (
        b"<CompleteMultipartUpload><Part><PartNumber>one</PartNumber><ETag>x</ETag></Part>"
        b"</CompleteMultipartUpload>"
    )
    path = f"/{BUCKET}/mp/bad?uploadId={upload}"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(
            "POST", path, body=body, headers=signed_headers(server.url + path, "POST", body)
        )
        answer = conn.getresponse()
        assert answer.status == 400 and b"MalformedXML" in answer.read()
    finally:
        conn.close()
    s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/bad", UploadId=upload)


def test_upload_part_copy_outside_the_source_is_invalid_range(s3):
    s3.put_object(Bucket=BUCKET, Key="mp/five", Body=b"12345")
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/copy")["UploadId"]
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.upload_part_copy(
            Bucket=BUCKET,
            Key="mp/copy",
            UploadId=upload,
            PartNumber=1,
            CopySource={"Bucket": BUCKET, "Key": "mp/five"},
            CopySourceRange="bytes=0-21",
        )
    assert error_of(info)[1] == "InvalidRange"
    s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/copy", UploadId=upload)


# -- signatures --------------------------------------------------------------------------------
def test_a_utf8_header_is_checked_against_the_text_its_client_signed(s3):
    """botocore signs a header's text and sends its UTF-8 bytes; the server read those
    bytes as Latin-1 and answered SignatureDoesNotMatch."""

    def raw_metadata(params, **_):
        params["headers"]["x-amz-meta-name"] = "Hello World\xe9"

    s3.meta.events.register("before-call.s3.PutObject", raw_metadata)
    try:
        s3.put_object(Bucket=BUCKET, Key="sig/utf8", Body=b"x")
    finally:
        s3.meta.events.unregister("before-call.s3.PutObject", raw_metadata)
    word = s3.head_object(Bucket=BUCKET, Key="sig/utf8")["Metadata"]["name"]
    encoded = word.removeprefix("=?UTF-8?B?").removesuffix("?=")
    assert base64.b64decode(encoded).decode() == "Hello World\xe9"


# -- buckets ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["foo-.bar", "foo.-bar", "192.168.5.123", "xn--bucket", "data--ol-s3"]
)
def test_bucket_names_s3_refuses_are_refused(s3, name):
    """(botocore lets these through: its check is only ``[a-zA-Z0-9.\\-_]{1,255}``)"""
    with pytest.raises(s3.exceptions.ClientError) as info:
        s3.create_bucket(Bucket=name)
    assert error_of(info) == (400, "InvalidBucketName")


def test_recreating_an_owned_bucket_is_200_in_us_east_1_and_409_elsewhere(s3):
    s3.create_bucket(Bucket="made-twice")
    s3.put_object(Bucket="made-twice", Key="kept", Body=b"x")
    s3.create_bucket(Bucket="made-twice")  # S3's us-east-1 rule: 200, nothing changed
    assert s3.get_object(Bucket="made-twice", Key="kept")["Body"].read() == b"x"
    elsewhere = {"LocationConstraint": "eu-west-1"}
    s3.create_bucket(Bucket="made-twice-eu", CreateBucketConfiguration=elsewhere)
    with pytest.raises(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket="made-twice-eu", CreateBucketConfiguration=elsewhere)
