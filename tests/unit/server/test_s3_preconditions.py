"""The pure halves of issue 38's S3 checks: a write's or delete's precondition against the
object it finds, the headers refused as not served, SigV2 recognized and refused."""

from __future__ import annotations

import pytest

from shipyard.server.errors import ApiError
from shipyard.server.s3_checks import check_headers, refuse_sigv2
from shipyard.server.s3_conditions import Precondition, write_precondition

OBJ = ("0123", 1_700_000_000.0, 10)  # (etag, modified, size)


def code(call) -> tuple[int, str]:
    with pytest.raises(ApiError) as info:
        call()
    return info.value.status, info.value.code


def test_a_write_condition_holds_or_is_412_and_a_vanished_object_is_409():
    Precondition(if_none_match=True).check("k", None, early=True)
    Precondition(if_match='"0123"').check("k", OBJ, early=False)
    Precondition(if_match="*").check("k", OBJ, early=False)
    Precondition().check("k", OBJ, early=False)
    assert code(lambda: Precondition(if_none_match=True).check("k", OBJ, True)) == (
        412,
        "PreconditionFailed",
    )
    assert code(lambda: Precondition(if_match='"x"').check("k", OBJ, False))[0] == 412
    assert code(lambda: Precondition(if_match="*").check("k", None, True)) == (404, "NoSuchKey")
    assert code(lambda: Precondition(if_match="*").check("k", None, False)) == (
        409,
        "ConditionalRequestConflict",
    )


def test_a_delete_condition_reads_size_and_time_and_refuses_if_none_match():
    cond = write_precondition({"if-match": "*", "x-amz-if-match-size": "10"}, delete=True)
    cond.check("k", OBJ, early=True)
    assert code(lambda: cond.check("k", ("0123", OBJ[1], 11), True))[0] == 412
    dated = write_precondition(
        {"x-amz-if-match-last-modified-time": "Tue, 14 Nov 2023 22:13:20 GMT"}, delete=True
    )
    dated.check("k", OBJ, early=True)
    assert code(lambda: dated.check("k", ("0123", OBJ[1] + 5, 10), True))[0] == 412
    assert code(lambda: write_precondition({"if-none-match": "*"}, delete=True)) == (
        501,
        "NotImplemented",
    )
    named = write_precondition({"if-none-match": '"e"'})  # ETags on a write: evaluated
    named.check("k", None, early=True)
    named.check("k", OBJ, early=True)
    assert code(lambda: named.check("k", ("e", OBJ[1], 10), True)) == (412, "PreconditionFailed")


@pytest.mark.parametrize(
    "route,headers",
    [
        ("put_object", {"x-amz-storage-class": "GLACIER"}),
        ("start_upload", {"x-amz-tagging": "a=b"}),
        ("copy_object", {"x-amz-website-redirect-location": "/x"}),
        ("put_object", {"x-amz-object-lock-legal-hold": "ON"}),
        ("put_object", {"x-amz-server-side-encryption": "aws:kms:dsse"}),
        ("put_object", {"x-amz-server-side-encryption-aws-kms-key-id": "alias/k"}),
        ("get_object", {"x-amz-server-side-encryption-customer-algorithm": "AES256"}),
        ("create_bucket", {"x-amz-bucket-object-lock-enabled": "true"}),
    ],
)
def test_headers_asking_for_what_is_not_served_are_not_implemented(route, headers):
    assert code(lambda: check_headers(route, headers)) == (501, "NotImplemented")


@pytest.mark.parametrize(
    "route,headers",
    [
        ("put_object", {"x-amz-server-side-encryption": "aws:kms"}),  # the SDK's default
        ("start_upload", {"x-amz-server-side-encryption": "AES256"}),
        ("put_object", {"x-amz-storage-class": "STANDARD"}),
        ("put_object", {"x-amz-object-lock-legal-hold": "OFF"}),
        ("create_bucket", {"x-amz-bucket-object-lock-enabled": "false"}),
        ("get_object", {"x-amz-storage-class": "GLACIER"}),  # only writes ask for one
    ],
)
def test_what_asks_for_nothing_is_accepted(route, headers):
    check_headers(route, headers)


def test_sigv2_is_invalid_request_and_sigv4_or_nothing_passes():
    message = "Please use AWS4-HMAC-SHA256."
    with pytest.raises(ApiError, match=message) as info:
        refuse_sigv2({"authorization": "AWS AKID:c2ln"}, {})
    assert (info.value.status, info.value.code) == (400, "InvalidRequest")
    query = {"AWSAccessKeyId": ["AKID"], "Signature": ["c2ln"], "Expires": ["1"]}
    assert code(lambda: refuse_sigv2({}, query)) == (400, "InvalidRequest")
    refuse_sigv2({"authorization": "AWS4-HMAC-SHA256 Credential=..."}, {})
    refuse_sigv2({}, {})
