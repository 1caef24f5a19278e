"""A multipart upload's checksum: the algorithm and type CreateMultipartUpload names, and
the object's checksum CompleteMultipartUpload makes of its parts', as S3 computes them.

S3 (``x-amz-checksum-algorithm`` / ``x-amz-checksum-type`` on CreateMultipartUpload):

- **COMPOSITE** (CRC32, SHA1, SHA256; the default for each but CRC64NVME): the checksum of
  the concatenated binary checksums of the parts, then ``-N`` for N parts, e.g.
  ``base64(sha256(sha256(p1) + sha256(p2) + sha256(p3))) + "-3"``;
- **FULL_OBJECT** (CRC32 here): the checksum of the whole object's bytes, no suffix, as a
  PutObject of the same bytes would have (computed as the parts are concatenated).

CRC32C and CRC64NVME need a native library botocore only uses with awscrt and are refused
(501) as they are on PutObject. Each part keeps its own checksum (computed by the server as
it is received, whatever the client sent beside it); CompleteMultipartUpload checks the
parts it lists against them (S3's ``InvalidPart`` on a mismatch, its ``InvalidRequest`` when
a COMPOSITE upload's Complete leaves one out) and a whole-object checksum sent with it
(``BadDigest``).
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from shipyard.server.errors import ApiError

COMPOSITE = "COMPOSITE"
FULL_OBJECT = "FULL_OBJECT"
# algorithm -> the types S3 allows for it, the first being its default
TYPES = {"crc32": (COMPOSITE, FULL_OBJECT), "sha1": (COMPOSITE,), "sha256": (COMPOSITE,)}
NOT_VERIFIED = ("crc32c", "crc64nvme")


@dataclass(frozen=True)
class UploadChecksum:
    """What an upload was created with: ``algorithm`` (lower case) and ``type``."""

    algorithm: str
    type: str

    @property
    def header(self) -> str:
        return f"x-amz-checksum-{self.algorithm}"

    @property
    def member(self) -> str:
        """The XML element and botocore member: ``ChecksumSHA256``."""
        return "Checksum" + self.algorithm.upper()


def from_create(headers: Mapping[str, str]) -> UploadChecksum | None:
    """The checksum a CreateMultipartUpload asks for (None: none), refused as S3 refuses
    an unknown algorithm, a type without an algorithm, or a type the algorithm lacks."""
    algorithm = headers.get("x-amz-checksum-algorithm", "").strip().lower()
    kind = headers.get("x-amz-checksum-type", "").strip().upper()
    if not algorithm:
        if kind:
            raise ApiError(
                "InvalidRequest",
                "The x-amz-checksum-type header can only be used with the "
                "x-amz-checksum-algorithm header.",
            )
        return None
    if algorithm in NOT_VERIFIED:
        raise ApiError(
            "NotImplemented",
            f"x-amz-checksum-algorithm {algorithm.upper()} is not verified by shipyard server; "
            "use CRC32, SHA1 or SHA256 (nothing was created)",
            501,
        )
    if algorithm not in TYPES:
        raise ApiError(
            "InvalidRequest",
            "Checksum algorithm provided is unsupported. Please try again with any of the "
            "valid types: [CRC32, SHA1, SHA256]",
        )
    if kind and kind not in (COMPOSITE, FULL_OBJECT):
        raise ApiError("InvalidRequest", "Value for x-amz-checksum-type header is invalid.")
    if kind and kind not in TYPES[algorithm]:
        raise ApiError(
            "InvalidRequest",
            f"The {kind} checksum type cannot be used with the {algorithm} checksum algorithm.",
        )
    return UploadChecksum(algorithm, kind or TYPES[algorithm][0])


def _digest(algorithm: str, data: bytes) -> bytes:
    if algorithm == "crc32":
        return zlib.crc32(data).to_bytes(4, "big")
    return hashlib.new(algorithm, data).digest()


def combine(kind: UploadChecksum, part_values: list[str], whole_crc32: int) -> str:
    """The object's checksum from its parts' (base64, in order): COMPOSITE's checksum of
    checksums with ``-N``, or FULL_OBJECT's CRC32 of all the bytes (``whole_crc32``)."""
    if kind.type == FULL_OBJECT:
        return base64.b64encode(whole_crc32.to_bytes(4, "big")).decode()
    joined = b"".join(base64.b64decode(value) for value in part_values)
    return base64.b64encode(_digest(kind.algorithm, joined)).decode() + f"-{len(part_values)}"


def check_listed(kind: UploadChecksum, number: int, listed: Mapping[str, str], kept: str) -> None:
    """A part as CompleteMultipartUpload lists it against the checksum it was stored with."""
    value = listed.get(kind.member)
    if value is None:
        if kind.type == COMPOSITE:
            raise ApiError(
                "InvalidRequest",
                f"The upload was created using a {kind.algorithm} checksum. The complete "
                "request must include the checksum for each part. It was missing for part "
                f"{number} in the request.",
            )
        return
    if value.strip() != kept:
        raise ApiError(
            "InvalidPart",
            f"One or more of the specified parts could not be found. Part {number}'s "
            f"{kind.member} {value.strip()!r} is not the {kept!r} it was uploaded with.",
        )


def check_whole(kind: UploadChecksum, headers: Mapping[str, str], made: str) -> None:
    """A whole-object checksum sent with CompleteMultipartUpload must be the one made
    (a COMPOSITE one compared with or without its ``-N``)."""
    sent = headers.get(kind.header)
    if sent is None:
        return
    if sent.strip().split("-", 1)[0] != made.split("-", 1)[0]:
        raise ApiError(
            "BadDigest",
            f"The {kind.algorithm} you specified did not match the calculated checksum "
            f"({made}); the upload is kept.",
        )
