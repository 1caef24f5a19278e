"""S3's multipart operations: CreateMultipartUpload, UploadPart, UploadPartCopy,
CompleteMultipartUpload, AbortMultipartUpload, ListParts and ListMultipartUploads, over the
store's uploads (``object_uploads``).

Split from :mod:`shipyard.server.s3_api` when uploads gained checksums (issue 38): an upload
created with ``x-amz-checksum-algorithm`` (boto3's transfer manager asks for CRC32 on every
upload) keeps each part's checksum, answers it on UploadPart and ListParts, checks the parts
CompleteMultipartUpload lists, and gives the object the checksum S3 gives it
(``s3_checksums``), which HeadObject/GetObject with ``ChecksumMode=ENABLED`` and
GetObjectAttributes return.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from typing import Protocol

from shipyard.server import s3_checksums, s3_conditions
from shipyard.server import s3_listings as listings
from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, tag, xml_response
from shipyard.server.object_uploads import Listed
from shipyard.server.objects import Obj, ObjectStore
from shipyard.server.s3_checks import Digests
from shipyard.server.s3_conditions import write_precondition
from shipyard.server.s3_listings import NS
from shipyard.server.s3_listings import int_arg as _int_arg
from shipyard.server.s3_listings import iso as _iso
from shipyard.server.s3_meta import request_meta


class Front(Protocol):
    """What the multipart operations use of the S3 front end (``s3_api.S3Api``)."""

    store: ObjectStore

    def receive(
        self, req: Request, want: str | None = None
    ) -> tuple[str, str, dict[str, str], Digests]: ...

    def source(self, req: Request) -> Obj: ...


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
OPERATIONS = frozenset(
    {
        "start_upload",
        "abort_upload",
        "upload_part",
        "upload_part_copy",
        "complete_upload",
        "list_uploads",
        "list_parts",
    }
)


def local(name: str) -> str:
    """An XML tag without its namespace: S3 reads request bodies sent with or without it."""
    return name.rsplit("}", 1)[-1]


def part_number(req: Request) -> int:
    number = _int_arg(req, "partNumber", 0)
    if not 1 <= number <= 10000:
        raise ApiError("InvalidArgument", "partNumber must be a whole number from 1 to 10000")
    return number


class MultipartApi:
    """The multipart operations of ``api`` (an ``S3Api``: its store, body and source
    readers)."""

    def __init__(self, api: Front) -> None:
        self.api = api
        self.uploads = api.store.multipart

    def start_upload(self, req: Request, bucket: str, key: str) -> Response:
        checksum = s3_checksums.from_create(req.headers)
        upload = self.uploads.start(
            bucket, key, req.headers.get("content-type"), request_meta(req), checksum
        )
        inner = tag("Bucket", bucket) + tag("Key", key) + tag("UploadId", upload)
        headers = {}
        if checksum is not None:
            headers = {
                "x-amz-checksum-algorithm": checksum.algorithm.upper(),
                "x-amz-checksum-type": checksum.type,
            }
        response = xml_response("InitiateMultipartUploadResult", inner, ns=NS)
        response.headers.update(headers)
        return response

    def abort_upload(self, req: Request, bucket: str, key: str) -> Response:
        self.uploads.abort(req.arg("uploadId") or "", bucket, key)
        return Response(204)

    def upload_part(self, req: Request, bucket: str, key: str) -> Response:
        """A part, stored with its checksum when the upload has an algorithm (computed
        here from the bytes; one the client sent is verified first). The upload is looked
        up before the body is read: NoSuchUpload costs no transfer."""
        number = part_number(req)
        upload_id = req.arg("uploadId") or ""
        _, _, kind, _ = self.uploads.get(upload_id, bucket, key)
        want = kind.algorithm if kind else None
        tmp, md5, checksums, digests = self.api.receive(req, want)
        value = digests.value(want) if want else ""
        self.uploads.put_part(upload_id, bucket, key, number, tmp, md5, value)
        if kind is not None:
            checksums = checksums | {kind.header: value}
        return Response(200, b"", {"ETag": f'"{md5}"'} | checksums)

    def upload_part_copy(self, req: Request, bucket: str, key: str) -> Response:
        """UploadPartCopy: a part made of (a range of) an existing object, as boto3's
        managed ``copy()`` of anything over its multipart threshold sends."""
        number = part_number(req)
        upload_id = req.arg("uploadId") or ""
        _, _, kind, _ = self.uploads.get(upload_id, bucket, key)
        src = self.api.source(req)
        s3_conditions.check(req.headers, src.etag, src.modified, s3_conditions.COPY_SOURCE)
        start, length = 0, src.size
        rng = req.headers.get("x-amz-copy-source-range")
        if rng:
            match = _RANGE.match(rng.strip())
            if not match or not match[1] or not match[2]:
                raise ApiError(
                    "InvalidArgument", f"x-amz-copy-source-range {rng!r} is not bytes=a-b"
                )
            start, end = int(match[1]), int(match[2])
            if end < start:
                raise ApiError(
                    "InvalidArgument", f"x-amz-copy-source-range {rng!r} ends before it starts"
                )
            if end >= src.size:
                raise ApiError(
                    "InvalidRange",
                    f"x-amz-copy-source-range {rng!r} is outside the {src.size}-byte source",
                    416,
                )
            length = end - start + 1
        want = kind.algorithm if kind else None
        digests = Digests({}, want)
        with open(src.file, "rb") as fh:
            fh.seek(start)
            tmp, md5, _ = self.api.store.write_temp(fh, length, digests)
        value = digests.value(want) if want else ""
        self.uploads.put_part(upload_id, bucket, key, number, tmp, md5, value)
        inner = tag("ETag", f'"{md5}"') + tag("LastModified", _iso(time.time()))
        if kind is not None:
            inner += tag(kind.member, value)
        return xml_response("CopyPartResult", inner, ns=NS)

    def complete_upload(self, req: Request, bucket: str, key: str) -> Response:
        try:
            root = ET.fromstring(req.body)
        except ET.ParseError:
            raise ApiError("MalformedXML", "CompleteMultipartUpload is not XML") from None
        parts: list[Listed] = []
        for part in (node for node in root.iter() if local(node.tag) == "Part"):
            fields = {local(child.tag): (child.text or "").strip() for child in part}
            number = fields.get("PartNumber", "")
            if not number.isdigit():
                raise ApiError("MalformedXML", f"PartNumber {number[:20]!r} is not a number")
            sums = {k: v for k, v in fields.items() if k.startswith("Checksum")}
            parts.append((int(number), fields.get("ETag", ""), sums))
        cond = write_precondition(req.headers)
        upload_id = req.arg("uploadId") or ""
        obj = self.uploads.complete(upload_id, bucket, key, parts, cond, req.headers)
        inner = tag("Bucket", bucket) + tag("Key", key) + tag("ETag", f'"{obj.etag}"')
        kind = obj.meta.get("x-amz-checksum-type")
        for name, value in obj.meta.items():
            if name.startswith("x-amz-checksum-") and name != "x-amz-checksum-type":
                inner += tag("Checksum" + name.rsplit("-", 1)[-1].upper(), value)
                inner += tag("ChecksumType", kind or s3_checksums.FULL_OBJECT)
        return xml_response("CompleteMultipartUploadResult", inner, ns=NS)

    def list_uploads(self, req: Request, bucket: str, key: str) -> Response:
        return listings.uploads(self.api.store, req, bucket)

    def list_parts(self, req: Request, bucket: str, key: str) -> Response:
        return listings.parts(self.api.store, req, bucket, key)
