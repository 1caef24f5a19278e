"""GetObjectAttributes (``GET /bucket/key?attributes``): what an object is without its
bytes, the attributes named in ``x-amz-object-attributes`` (ETag, Checksum, ObjectParts,
StorageClass, ObjectSize), as S3 answers them.

A multipart object lists its parts (``PartsCount``, and each part's number, size and, when
its upload kept checksums, checksum), paged by ``x-amz-max-parts`` and
``x-amz-part-number-marker`` as ListParts pages; an object of one PUT has no ObjectParts.
A multipart object from before part sizes were kept names its part count only.
"""

from __future__ import annotations

import email.utils

from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, tag, xml_response
from shipyard.server.objects import Obj, part_checksums, part_sizes
from shipyard.server.s3_listings import NS

ATTRIBUTES = ("ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize")
CHECKSUM = "x-amz-checksum-"
CHECKSUM_TYPE = "x-amz-checksum-type"


def _whole(req: Request, header: str, default: int) -> int:
    value = req.headers.get(header, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ApiError("InvalidArgument", f"{header} must be a whole number, not {value[:20]!r}")
    return int(value)


def asked(req: Request) -> list[str]:
    """The attributes asked for; S3's InvalidArgument for none or an unknown one."""
    names = [n.strip() for n in req.headers.get("x-amz-object-attributes", "").split(",")]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in ATTRIBUTES]
    if not names or unknown:
        raise ApiError(
            "InvalidArgument",
            f"x-amz-object-attributes names {', '.join(unknown) or 'nothing'}; name one or "
            f"more of {', '.join(ATTRIBUTES)}",
        )
    return names


def _checksum(obj: Obj) -> str:
    inner = ""
    for name, value in obj.meta.items():
        if name.startswith(CHECKSUM) and name != CHECKSUM_TYPE:
            inner += tag("Checksum" + name[len(CHECKSUM) :].upper(), value)
    if not inner:
        return ""
    inner += tag("ChecksumType", obj.meta.get(CHECKSUM_TYPE, "FULL_OBJECT"))
    return f"<Checksum>{inner}</Checksum>"


def _parts(req: Request, obj: Obj) -> str:
    count = int(obj.etag.rsplit("-", 1)[1])
    marker = _whole(req, "x-amz-part-number-marker", 0)
    limit = _whole(req, "x-amz-max-parts", 1000)
    sizes = part_sizes(obj) or []
    sums = part_checksums(obj) or []
    names = [n for n in obj.meta if n.startswith(CHECKSUM) and n != CHECKSUM_TYPE]
    member = "Checksum" + names[0][len(CHECKSUM) :].upper() if names else ""
    numbers = [n for n in range(1, len(sizes) + 1) if n > marker]
    page, truncated = numbers[:limit], len(numbers) > limit
    inner = (
        tag("PartsCount", count)
        + tag("PartNumberMarker", marker)
        + tag("MaxParts", limit)
        + tag("IsTruncated", "true" if truncated else "false")
    )
    if page:
        inner += tag("NextPartNumberMarker", page[-1])
    for number in page:
        part = tag("PartNumber", number) + tag("Size", sizes[number - 1])
        if member and number <= len(sums) and sums[number - 1]:
            part += tag(member, sums[number - 1])
        inner += f"<Part>{part}</Part>"
    return f"<ObjectParts>{inner}</ObjectParts>"


def answer(req: Request, obj: Obj) -> Response:
    """The GetObjectAttributesResponse for ``obj``."""
    names = asked(req)
    inner = ""
    if "ETag" in names:
        inner += tag("ETag", obj.etag)
    if "Checksum" in names:
        inner += _checksum(obj)
    if "ObjectParts" in names and "-" in obj.etag:
        inner += _parts(req, obj)
    if "StorageClass" in names:
        inner += tag("StorageClass", "STANDARD")
    if "ObjectSize" in names:
        inner += tag("ObjectSize", obj.size)
    response = xml_response("GetObjectAttributesResponse", inner, ns=NS)
    response.headers["Last-Modified"] = email.utils.formatdate(obj.modified, usegmt=True)
    return response
