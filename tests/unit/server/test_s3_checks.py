"""What S3 refuses before touching data: sub-resources not served, bad keys, digests that
do not match; and what the object store leaves after an interrupted body: nothing."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zlib

import pytest

from shipyard.server.errors import ApiError
from shipyard.server.objects import ObjectStore
from shipyard.server.s3_api import _Chunked
from shipyard.server.s3_checks import Digests, check_key, check_sub_resources


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize("name", ["tagging", "acl", "cors", "lifecycle", "policy", "versioning"])
def test_sub_resources_not_served_are_not_implemented(name):
    with pytest.raises(ApiError) as info:
        check_sub_resources("DELETE", {name: [""]})
    assert (info.value.code, info.value.status) == ("NotImplemented", 501)
    assert "nothing was changed" in info.value.message


def test_served_parameters_pass():
    check_sub_resources("GET", {"list-type": ["2"], "x-id": ["ListObjectsV2"], "prefix": [""]})
    check_sub_resources("GET", {"versionId": ["null"]})
    with pytest.raises(ApiError):
        check_sub_resources("GET", {"versionId": ["abc"]})


def test_key_rules():
    check_key("k" * 1024)
    check_key("é" * 512)  # 1,024 bytes of UTF-8
    with pytest.raises(ApiError) as info:
        check_key("é" * 513)
    assert info.value.code == "KeyTooLongError"
    with pytest.raises(ApiError) as info:
        check_key("a\x00b")
    assert info.value.code == "InvalidArgument"


def test_digests():
    body = b"hello world"
    good = {
        "content-md5": b64(hashlib.md5(body).digest()),
        "x-amz-checksum-sha256": b64(hashlib.sha256(body).digest()),
        "x-amz-checksum-sha1": b64(hashlib.sha1(body).digest()),
        "x-amz-checksum-crc32": b64(zlib.crc32(body).to_bytes(4, "big")),
    }
    for name, value in good.items():
        sums = Digests({name: value})
        sums.update(body[:5])
        sums.update(body[5:])
        sums.verify()
        sums = Digests({name: value})
        sums.update(body + b"!")
        with pytest.raises(ApiError) as info:
            sums.verify()
        assert info.value.code == "BadDigest"
    with pytest.raises(ApiError) as info:
        Digests({"content-md5": "not base64!"})
    assert info.value.code == "InvalidDigest"
    with pytest.raises(ApiError) as info:
        Digests({"x-amz-checksum-crc32c": "AAAAAA=="})
    assert info.value.code == "NotImplemented" and "CRC32" in info.value.message


def test_aws_chunked_trailer_checksum_is_checked():
    body = b"hello"
    crc = b64(zlib.crc32(body).to_bytes(4, "big"))
    wire = b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:" + crc.encode() + b"\r\n\r\n"
    sums = Digests({"x-amz-trailer": "x-amz-checksum-crc32"})
    data = _Chunked(io.BytesIO(wire), sums).read(100)
    sums.update(data)
    assert data == body
    sums.verify()
    bad = wire.replace(crc.encode(), b"AAAAAA==")
    sums = Digests({"x-amz-trailer": "x-amz-checksum-crc32"})
    sums.update(_Chunked(io.BytesIO(bad), sums).read(100))
    with pytest.raises(ApiError):
        sums.verify()
    with pytest.raises(ApiError) as info:
        _Chunked(io.BytesIO(b"zz\r\nhello\r\n")).read(100)
    assert info.value.code == "InvalidChunkSizeError"


class _Resets(io.RawIOBase):
    """A body whose client resets after a few bytes."""

    def __init__(self) -> None:
        self.sent = False

    def read(self, n: int = -1) -> bytes:
        if not self.sent:
            self.sent = True
            return b"x" * 100
        raise ConnectionResetError("peer reset")


def test_an_interrupted_body_leaves_no_temporary_file(tmp_path):
    store = ObjectStore(str(tmp_path))
    with pytest.raises(ConnectionResetError):
        store.write_temp(_Resets(), 10_000)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as info:
        store.write_temp(io.BytesIO(b"short"), 10_000)
    assert info.value.code == "IncompleteBody"
    with pytest.raises(ApiError):
        store.write_temp(io.BytesIO(b"abc"), 3, Digests({"content-md5": b64(b"\0" * 16)}))
    assert os.listdir(tmp_path / "tmp") == []


def test_startup_sweeps_stale_temporary_files(tmp_path):
    store = ObjectStore(str(tmp_path))
    (tmp_path / "tmp" / "left-by-a-crash").write_bytes(b"partial")
    store.sweep_temp()
    assert os.listdir(tmp_path / "tmp") == []
