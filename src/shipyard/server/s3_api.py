"""S3's REST API (the subset the SageMaker SDK, boto3's transfer manager and shipyard's
agents use) over ``objects.ObjectStore``.

Path-style addressing (``/bucket/key``) and virtual-hosted style (``bucket.<host>``)
both work. Bodies stream to disk; ``aws-chunked`` bodies (what newer botocore sends with
flexible checksums) are decoded on the way; a signed payload hash is checked.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.header
import email.utils
import hashlib
import io
import os
import re
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from typing import BinaryIO

from shipyard.server import s3_attributes, s3_conditions
from shipyard.server import s3_listings as listings
from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, tag, xml_response
from shipyard.server.objects import Obj, ObjectStore, part_checksums, part_sizes
from shipyard.server.s3_checks import (
    MAX_DELETE_KEYS,
    Digests,
    check_headers,
    check_key,
    check_sub_resources,
    check_uri,
)
from shipyard.server.s3_conditions import Precondition, http_date, write_precondition
from shipyard.server.s3_listings import NS
from shipyard.server.s3_listings import iso as _iso
from shipyard.server.s3_meta import STORED_HEADERS, request_meta
from shipyard.server.s3_multipart import OPERATIONS, MultipartApi, local, part_number

MAX_OBJECT = 5 << 30
CHECKSUM = "x-amz-checksum-"  # an object's stored checksums: meta keys by this prefix
CHECKSUM_TYPE = "x-amz-checksum-type"  # ... and its type (COMPOSITE for most multipart ones)
MAX_XML_BODY = 8 << 20  # a DeleteObjects of 1,000 keys of 1,024 bytes fits
CHUNK_READ = 1 << 20
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
# GetObject's response-* parameters: the headers they replace in the answer
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
    "response-content-language": "Content-Language",
    "response-cache-control": "Cache-Control",
    "response-expires": "Expires",
}


def _http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def error_response(err: ApiError, head: bool, request_id: str = "") -> Response:
    """S3's error document; a HEAD answer has no body, so its code goes in a header. A
    304 (a conditional GET whose object did not change) has no body either."""
    if head or err.status == 304:
        return Response(err.status, b"", {"x-amz-error-code": err.code})
    inner = tag("Code", err.code) + tag("Message", err.message) + tag("RequestId", request_id)
    return xml_response("Error", inner, err.status)


class _Chunked:
    """Reads an ``aws-chunked`` body as its payload. Chunk sizes are hex (a malformed one
    is a 400, not a crash); trailers after the last chunk (``x-amz-checksum-*``) go to
    ``digests`` to be checked like headers."""

    def __init__(self, raw: BinaryIO, digests: Digests | None = None) -> None:
        self.raw, self.left, self.done = raw, 0, False
        self.digests = digests

    def read(self, n: int = -1) -> bytes:
        if n < 0:  # everything (a small body: DeleteObjects, CompleteMultipartUpload)
            parts = []
            while chunk := self.read(CHUNK_READ):
                parts.append(chunk)
                if sum(map(len, parts)) > MAX_XML_BODY:
                    raise ApiError("MaxMessageLengthExceeded", "the request body is too large")
            return b"".join(parts)
        out = b""
        while len(out) < n and not self.done:
            if self.left == 0:
                line = self.raw.readline(4096)
                if not line:
                    raise ApiError("IncompleteBody", "the aws-chunked body ended early")
                line = line.strip()
                if not line:
                    continue
                try:
                    size = int(line.split(b";")[0], 16)
                except ValueError:
                    size = -1
                if size < 0:
                    raise ApiError(
                        "InvalidChunkSizeError",
                        f"aws-chunked size {line[:32]!r} is not a hexadecimal number",
                    )
                if size == 0:
                    self.done = True
                    self._trailers()
                    break
                self.left = size
            chunk = self.raw.read(min(self.left, n - len(out)))
            if not chunk:
                raise ApiError("IncompleteBody", "the aws-chunked body ended early")
            out += chunk
            self.left -= len(chunk)
            if self.left == 0:
                self.raw.readline(16)  # the CRLF after each chunk
        return out

    def _trailers(self) -> None:
        for _ in range(16):
            line = self.raw.readline(4096).strip()
            if not line:
                return
            name, _, value = line.decode("latin-1").partition(":")
            if self.digests is not None:
                self.digests.add_trailer(name, value)


# query parameters that select an operation (the others only qualify one)
SELECTORS = frozenset(
    {"uploads", "uploadId", "partNumber", "delete", "location", "versions", "attributes"}
)
_NONE: frozenset[str] = frozenset()
# (has bucket, has key, method, selectors) -> S3Api method
ROUTES: dict[tuple[bool, bool, str, frozenset[str]], str] = {
    (False, False, "GET", _NONE): "list_buckets",
    (True, False, "PUT", _NONE): "create_bucket",
    (True, False, "HEAD", _NONE): "head_bucket",
    (True, False, "DELETE", _NONE): "delete_bucket",
    (True, False, "GET", _NONE): "list_objects",
    (True, False, "GET", frozenset({"location"})): "get_location",
    (True, False, "GET", frozenset({"uploads"})): "list_uploads",
    (True, False, "GET", frozenset({"versions"})): "list_versions",
    (True, False, "POST", frozenset({"delete"})): "delete_objects",
    (True, True, "PUT", _NONE): "put_object",
    (True, True, "PUT+copy", _NONE): "copy_object",
    (True, True, "PUT", frozenset({"uploadId", "partNumber"})): "upload_part",
    (True, True, "PUT+copy", frozenset({"uploadId", "partNumber"})): "upload_part_copy",
    (True, True, "GET", _NONE): "get_object",
    (True, True, "GET", frozenset({"attributes"})): "get_attributes",
    (True, True, "HEAD", _NONE): "get_object",
    (True, True, "GET", frozenset({"uploadId"})): "list_parts",
    (True, True, "POST", frozenset({"uploads"})): "start_upload",
    (True, True, "POST", frozenset({"uploadId"})): "complete_upload",
    (True, True, "DELETE", frozenset({"uploadId"})): "abort_upload",
    (True, True, "DELETE", _NONE): "delete_object",
}


def http_chunked(raw: BinaryIO) -> BinaryIO:
    """A ``Transfer-Encoding: chunked`` body as its payload (the same framing as
    aws-chunked, without signatures): an S3 upload of unknown length streams to disk."""
    return _Chunked(raw)  # type: ignore[return-value]


class S3Api:
    def __init__(self, store: ObjectStore, hosts: tuple[str, ...] = ()) -> None:
        self.store = store
        self.hosts = hosts  # names the server answers to (virtual-hosted style)
        self.multipart = MultipartApi(self)  # the multipart operations (s3_multipart.py)

    def _split(self, req: Request) -> tuple[str, str]:
        host = req.headers.get("host", "").rsplit(":", 1)[0]
        for base in self.hosts:
            if host.endswith("." + base):
                return host[: -len(base) - 1], req.path.lstrip("/")
        bucket, _, key = req.path.lstrip("/").partition("/")
        return bucket, key

    def handle(self, req: Request) -> Response:
        """Every answer carries an ``x-amz-request-id`` (the one an error document names),
        which botocore reports as the response's RequestId."""
        request_id = uuid.uuid4().hex[:16].upper()
        try:
            response = self._handle(req)
        except ApiError as err:
            response = error_response(err, req.method == "HEAD", request_id)
        response.headers["x-amz-request-id"] = request_id
        return response

    def _handle(self, req: Request) -> Response:
        """Route on method, path and the query's operation selectors together, as S3 does:
        ``DELETE /b?location`` is not DeleteBucket, and is refused as such."""
        check_uri(req.raw_path)
        bucket, key = self._split(req)
        q = req.query
        m = req.method
        check_sub_resources(m, q)  # before anything is read or written
        if key and m in ("PUT", "POST"):
            check_key(key)
        selectors = frozenset(q) & SELECTORS
        if m == "PUT" and key and "x-amz-copy-source" in req.headers:
            m = "PUT+copy"
        route = ROUTES.get((bool(bucket), bool(key), m, selectors))
        if route is None and m in ("GET", "HEAD") and key and selectors == {"partNumber"}:
            route = ROUTES[(True, True, m, frozenset())]
        if route is None:
            what = " ".join(sorted(selectors)) or "no sub-resource"
            raise ApiError(
                "NotImplemented",
                f"{req.method} on a {'key' if key else 'bucket' if bucket else 'service'} "
                f"with {what} is not an operation shipyard server implements (nothing was "
                "changed)",
                501,
            )
        check_headers(route, req.headers)  # what is not served changes nothing
        target = self.multipart if route in OPERATIONS else self
        return getattr(target, route)(req, bucket, key)

    def head_bucket(self, req: Request, bucket: str, key: str) -> Response:
        self.store.bucket_region(bucket)
        return Response(200, b"", {"x-amz-bucket-region": req.region})

    def delete_bucket(self, req: Request, bucket: str, key: str) -> Response:
        self.store.delete_bucket(bucket)
        return Response(204)

    def get_location(self, req: Request, bucket: str, key: str) -> Response:
        region = self.store.bucket_region(bucket)
        inner = "" if region == "us-east-1" else region
        return xml_response("LocationConstraint", inner, ns=NS)

    def delete_object(self, req: Request, bucket: str, key: str) -> Response:
        """DeleteObject, conditional on If-Match (and the last-modified time and size S3
        also takes), evaluated in the delete's own transaction."""
        self.store.delete(bucket, key, write_precondition(req.headers, delete=True))
        return Response(204)

    # -- buckets --------------------------------------------------------------------------
    def list_buckets(self, req: Request, bucket: str, key: str) -> Response:
        return listings.buckets(self.store, req)

    def create_bucket(self, req: Request, bucket: str, key: str) -> Response:
        region = req.region
        body = req.body
        if body.strip():
            try:
                node = ET.fromstring(body).find(f"{{{NS}}}LocationConstraint")
            except ET.ParseError:
                raise ApiError("MalformedXML", "CreateBucketConfiguration is not XML") from None
            if node is not None and node.text:
                region = node.text
        self.store.create_bucket(bucket, region)
        return Response(200, b"", {"Location": f"/{bucket}"})

    def list_objects(self, req: Request, bucket: str, key: str) -> Response:
        return listings.objects(self.store, req, bucket)

    def delete_objects(self, req: Request, bucket: str, key: str) -> Response:
        digests = Digests(req.headers)
        digests.update(req.body)
        digests.verify()
        try:
            root = ET.fromstring(req.body)
        except ET.ParseError:
            raise ApiError("MalformedXML", "the Delete body is not XML") from None
        if "if-match" in req.headers or "if-none-match" in req.headers:
            raise ApiError(
                "NotImplemented",
                "DeleteObjects takes its conditions per object (ETag in the body), not as "
                "If-Match/If-None-Match headers; nothing was deleted",
                501,
            )
        entries = [_delete_entry(node) for node in root if local(node.tag) == "Object"]
        if len(entries) > MAX_DELETE_KEYS:
            raise ApiError(
                "MalformedXML",
                f"one DeleteObjects names at most {MAX_DELETE_KEYS} keys, not {len(entries)}; "
                "nothing was deleted",
            )
        self.store.bucket_region(bucket)
        quiet = (root.findtext(f"{{{NS}}}Quiet") or "").strip().lower() == "true"
        done = []
        for key, cond in entries:
            try:
                self.store.delete(bucket, key, cond)
            except ApiError as err:  # this entry's condition: reported, the others go on
                done.append(
                    "<Error>"
                    + tag("Key", key)
                    + tag("Code", err.code)
                    + tag("Message", err.message)
                    + "</Error>"
                )
                continue
            if not quiet:
                done.append(f"<Deleted>{tag('Key', key)}</Deleted>")
        return xml_response("DeleteResult", "".join(done), ns=NS)

    # -- objects --------------------------------------------------------------------------
    def receive(
        self, req: Request, want: str | None = None
    ) -> tuple[str, str, dict[str, str], Digests]:
        """The request body into a temporary file: (path, md5 hex, the x-amz-checksum-*
        it was sent with, to keep, and its digests: ``want`` names an algorithm whose value
        is needed whatever was sent). Its signed SHA-256, Content-MD5 and x-amz-checksum-*
        (headers, or trailers after an aws-chunked body, read to its end) are checked; a
        mismatch stores nothing."""
        if req.length > MAX_OBJECT:
            raise ApiError("EntityTooLarge", "an object (or part) is at most 5 GiB", 400)
        sha_header = req.headers.get("x-amz-content-sha256", "")
        digests = Digests(req.headers, want)
        # framed when the signer says so (STREAMING-*) or sends the decoded length; a bare
        # "Content-Encoding: aws-chunked" over a plain signed body is only a stored coding
        chunked = sha_header.startswith("STREAMING-") or (
            "aws-chunked" in req.headers.get("content-encoding", "")
            and "x-amz-decoded-content-length" in req.headers
        )
        if chunked:
            try:
                length = int(req.headers.get("x-amz-decoded-content-length", "-1"))
            except ValueError:
                length = -1
            if length < 0:
                raise ApiError(
                    "MissingContentLength",
                    "an aws-chunked body needs x-amz-decoded-content-length (a whole number)",
                )
            raw = req.stream if req._body is None else io.BytesIO(req._body)  # read: signed
            stream: BinaryIO = _Chunked(raw, digests)  # type: ignore[assignment]
            if req.length < 0:
                raise ApiError("InvalidRequest", "aws-chunked inside Transfer-Encoding: chunked")
        elif req._body is not None:  # read (and checked) already, with the signature
            length, stream = len(req._body), io.BytesIO(req._body)
        else:
            length, stream = req.length, req.stream
        if chunked:  # to the last chunk and its trailers, then the size declared
            tmp, md5, sha = self.store.write_temp(stream, -1, digests)
            if os.path.getsize(tmp) != length:
                os.unlink(tmp)
                raise ApiError(
                    "IncompleteBody",
                    f"the aws-chunked body holds {os.path.getsize(tmp)} bytes, not the "
                    f"x-amz-decoded-content-length {length}",
                )
        else:
            tmp, md5, sha = self.store.write_temp(stream, length, digests)
        if re.fullmatch(r"[0-9a-f]{64}", sha_header) and sha_header != sha:
            os.unlink(tmp)
            raise ApiError(
                "XAmzContentSHA256Mismatch", "the body does not match its signed SHA-256"
            )
        return tmp, md5, digests.checksums(), digests

    def put_object(self, req: Request, bucket: str, key: str) -> Response:
        cond = self._precondition(req, bucket, key)  # refused before the body is read
        tmp, md5, checksums, _ = self.receive(req)
        meta = request_meta(req) | checksums
        obj = self.store.commit(bucket, key, tmp, md5, req.headers.get("content-type"), meta, cond)
        return Response(200, b"", {"ETag": f'"{obj.etag}"'} | checksums)

    def _precondition(self, req: Request, bucket: str, key: str) -> Precondition:
        """A write's If-None-Match: * / If-Match, checked now (so a doomed upload is
        refused before its body is read) and again where the store commits the write."""
        self.store.bucket_region(bucket)
        cond = write_precondition(req.headers)
        if cond:
            cond.check(key, self.store.current(bucket, key), early=True)
        return cond

    def source(self, req: Request) -> Obj:
        raw = req.headers["x-amz-copy-source"]
        path, _, version = raw.partition("?")
        if version and version != "versionId=null":
            raise ApiError(
                "NotImplemented", "copying a version: buckets here are not versioned", 501
            )
        source = urllib.parse.unquote(path).lstrip("/")
        src_bucket, _, src_key = source.partition("/")
        if not src_bucket or not src_key:
            raise ApiError("InvalidArgument", f"x-amz-copy-source {raw!r} is not bucket/key")
        return self.store.get(src_bucket, src_key)

    def copy_object(self, req: Request, bucket: str, key: str) -> Response:
        src = self.source(req)
        s3_conditions.check(req.headers, src.etag, src.modified, s3_conditions.COPY_SOURCE)
        directive = req.headers.get("x-amz-metadata-directive", "COPY").upper()
        if directive not in ("COPY", "REPLACE"):
            raise ApiError("InvalidArgument", "x-amz-metadata-directive is COPY or REPLACE")
        if directive == "COPY" and (src.bucket, src.key) == (bucket, key):
            raise ApiError(
                "InvalidRequest",
                "copying an object onto itself changes nothing; send "
                "MetadataDirective=REPLACE with the new metadata",
            )
        content_type, meta = src.content_type, src.meta
        if directive == "REPLACE":  # new metadata; the checksums stay the bytes' own
            content_type = req.headers.get("content-type")
            meta = request_meta(req) | {k: v for k, v in src.meta.items() if k.startswith(CHECKSUM)}
        cond = self._precondition(req, bucket, key)  # the destination's conditions
        with open(src.file, "rb") as fh:
            tmp, _, _ = self.store.write_temp(fh, src.size)
        obj = self.store.commit(bucket, key, tmp, src.etag, content_type, meta, cond)
        inner = tag("ETag", f'"{obj.etag}"') + tag("LastModified", _iso(obj.modified))
        return xml_response("CopyObjectResult", inner, ns=NS)

    def get_attributes(self, req: Request, bucket: str, key: str) -> Response:
        return s3_attributes.answer(req, self.store.get(bucket, key))

    def list_versions(self, req: Request, bucket: str, key: str) -> Response:
        return listings.versions(self.store, req, bucket)

    def get_object(self, req: Request, bucket: str, key: str) -> Response:
        """GetObject and HeadObject. A GET opens the object's file before it answers: the
        headers and the bytes are then one version's, whatever an overwrite or delete does
        meanwhile (each version is its own file, and an open file outlives its unlink)."""
        handle: BinaryIO | None = None
        for _ in range(8):  # an overwrite between the lookup and the open: look again
            obj = self.store.get(bucket, key)
            if req.method == "HEAD":
                break
            try:
                handle = open(obj.file, "rb")  # noqa: SIM115 - the HTTP layer closes it
                break
            except FileNotFoundError:
                continue
        else:
            raise ApiError("SlowDown", f"s3://{bucket}/{key} is being rewritten; retry", 503)
        try:
            response = self._answer(req, obj)
        except BaseException:
            if handle is not None:
                handle.close()
            raise
        if response.file is not None and handle is not None:
            response.handle = handle
        elif handle is not None:
            handle.close()
        return response

    def _answer(self, req: Request, obj: Obj) -> Response:
        """The answer to a GET or HEAD of ``obj``: its headers and which of its bytes."""
        try:
            s3_conditions.check(req.headers, obj.etag, obj.modified)
        except ApiError as err:
            if err.status != 304:
                raise
            kept = ("ETag", "Last-Modified", "Cache-Control", "Expires")
            unchanged = {k: v for k, v in _object_headers(obj).items() if k in kept}
            return Response(304, b"", unchanged)  # S3 names the version the caller has
        whole = req.arg("partNumber") is None and not req.headers.get("range")
        wants = req.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
        headers = _object_headers(obj, checksums=wants and whole)
        for param, header in RESPONSE_OVERRIDES.items():
            value = req.arg(param)
            if value is not None:
                headers[header] = value
        start, length, status = 0, obj.size, 200
        if req.arg("partNumber") is not None:
            number = part_number(req)
            sizes = part_sizes(obj) if "-" in obj.etag else [obj.size]
            if sizes is None:
                raise ApiError(
                    "NotImplemented",
                    "this multipart object was stored before part sizes were kept; use a Range",
                    501,
                )
            if number > len(sizes):
                raise ApiError(
                    "InvalidPartNumber",
                    f"the object has {len(sizes)} part(s), not part {number}",
                    416,
                )
            if "-" in obj.etag:  # a multipart object, one part included: S3 counts parts
                start, length, status = sum(sizes[: number - 1]), sizes[number - 1], 206
                end = start + length - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{obj.size}"
                headers["x-amz-mp-parts-count"] = str(len(sizes))
                headers["Content-Length"] = str(length)
                if wants:
                    headers |= _part_checksum(obj, number)
                if req.method == "HEAD":
                    return Response(status, b"", headers)
                return Response(status, b"", headers, file=obj.file, offset=start, length=length)
        rng = req.headers.get("range")
        if rng:
            match = _RANGE.match(rng.strip())
            if not match or (not match[1] and not match[2]):
                raise ApiError("InvalidRange", f"range {rng!r} is not bytes=a-b", 416)
            if match[1]:
                start = int(match[1])
                end = int(match[2]) if match[2] else obj.size - 1
            else:
                start, end = max(0, obj.size - int(match[2])), obj.size - 1
            end = min(end, obj.size - 1)
            if start >= obj.size or end < start:
                raise ApiError("InvalidRange", f"range {rng!r} is outside the object", 416)
            length, status = end - start + 1, 206
            headers["Content-Range"] = f"bytes {start}-{end}/{obj.size}"
        headers["Content-Length"] = str(length)
        if req.method == "HEAD":
            return Response(status, b"", headers)
        return Response(status, b"", headers, file=obj.file, offset=start, length=length)


def _meta_header(value: str) -> str:
    """Non-ASCII metadata goes back as an RFC 2047 encoded-word, as S3 sends it."""
    if value.isascii():
        return value
    return "=?UTF-8?B?" + base64.b64encode(value.encode("utf-8")).decode() + "?="


def _object_headers(obj: Obj, checksums: bool = False) -> dict[str, str]:
    """An object's headers; its stored x-amz-checksum-* only with ``checksums`` (a whole
    object asked with x-amz-checksum-mode: ENABLED, as S3 answers them)."""
    headers = {
        "ETag": f'"{obj.etag}"',
        "Last-Modified": _http_date(obj.modified),
        "Content-Type": obj.content_type or "binary/octet-stream",
        "Accept-Ranges": "bytes",
    }
    for name, value in obj.meta.items():
        if name in STORED_HEADERS:
            headers[STORED_HEADERS[name]] = value
        elif name.startswith(CHECKSUM):
            if checksums and name != CHECKSUM_TYPE:
                headers[name] = value
                headers[CHECKSUM_TYPE] = obj.meta.get(CHECKSUM_TYPE, "FULL_OBJECT")
        else:
            headers[name] = _meta_header(value)
    return headers


def _part_checksum(obj: Obj, number: int) -> dict[str, str]:
    """Part ``number``'s checksum of a multipart object whose upload kept them, with the
    object's checksum type (S3 answers these to GET/HEAD ?partNumber in checksum mode)."""
    sums = part_checksums(obj)
    names = [name for name in obj.meta if name.startswith(CHECKSUM) and name != CHECKSUM_TYPE]
    if not sums or not names or number > len(sums) or not sums[number - 1]:
        return {}
    return {names[0]: sums[number - 1], CHECKSUM_TYPE: obj.meta.get(CHECKSUM_TYPE, "FULL_OBJECT")}


def _delete_entry(node: ET.Element) -> tuple[str, Precondition | None]:
    """One DeleteObjects <Object>: its key and the conditions S3 evaluates per object
    (ETag, LastModifiedTime, Size)."""
    fields = {local(child.tag): (child.text or "") for child in node}
    etag, when, size = fields.get("ETag"), fields.get("LastModifiedTime"), fields.get("Size")
    if etag is None and when is None and size is None:
        return fields.get("Key", ""), None
    try:
        # botocore sends an HTTP date (the model's rfc822); ISO 8601 is taken too
        modified = (
            (http_date(when) or dt.datetime.fromisoformat(when.strip()).timestamp())
            if when
            else None
        )
        length = int(size) if size is not None else None
    except ValueError:
        raise ApiError(
            "MalformedXML", "an Object's LastModifiedTime or Size is malformed"
        ) from None
    return fields.get("Key", ""), Precondition(False, etag, modified, length)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
