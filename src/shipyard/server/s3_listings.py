"""S3's listings: buckets, a bucket's objects (v1 and v2) and their versions, multipart
uploads and an upload's parts.

Split from :mod:`shipyard.server.s3_api` (issue 26): these read the store and write one
XML page each, with S3's pagination rules (markers and continuation tokens, common
prefixes under a delimiter, ``encoding-type=url``, ``max-keys=0``), which is what the S3
conformance suite's listing group checks; the API class routes to them.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse

from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, tag, xml_response
from shipyard.server.objects import ObjectStore

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
OWNER = "<Owner><ID>shipyard</ID><DisplayName>shipyard</DisplayName></Owner>"  # one identity


def iso(ts: float) -> str:
    """S3's timestamps in listings: ISO 8601, UTC, milliseconds."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def int_arg(req: Request, name: str, default: int) -> int:
    """A whole-number query argument (``max-uploads``, ``part-number-marker``...)."""
    value = req.arg(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ApiError("InvalidArgument", f"{name} must be a whole number, not {value!r}")
    return number


def buckets(store: ObjectStore, req: Request) -> Response:
    """ListBuckets, paginated as S3 has since 2024 (``max-buckets``, a continuation token:
    the last name given, ``prefix``); without them every bucket, as before."""
    limit = int_arg(req, "max-buckets", 10000)
    if not 1 <= limit <= 10000:
        raise ApiError("InvalidArgument", f"max-buckets must be from 1 to 10000, not {limit}")
    prefix = req.arg("prefix", "") or ""
    after = urllib.parse.unquote(req.arg("continuation-token", "") or "")
    found = [(n, c) for n, c in store.buckets() if n.startswith(prefix) and n > after]
    page, more = found[:limit], len(found) > limit
    items = "".join(
        f"<Bucket>{tag('Name', n)}{tag('CreationDate', iso(c))}</Bucket>" for n, c in page
    )
    inner = f"{OWNER}<Buckets>{items}</Buckets>"
    if more:
        inner += tag("ContinuationToken", urllib.parse.quote(page[-1][0]))
    if prefix:
        inner += tag("Prefix", prefix)
    return xml_response("ListAllMyBucketsResult", inner, ns=NS)


Entry = tuple[str, int, str, float]  # key, size, etag, last modified


def _page(
    store: ObjectStore, bucket: str, prefix: str, delimiter: str, start: str, max_keys: int
) -> tuple[list[Entry], list[str], bool, str]:
    """One page of keys after ``start``: (objects, common prefixes, truncated, last
    entry), common prefixes rolled up under ``delimiter`` as S3 does."""
    contents: list[Entry] = []
    prefixes: list[str] = []
    truncated, last = False, start
    scan_from = start
    if delimiter and start.startswith(prefix) and delimiter in start[len(prefix) :]:
        # the previous page ended on a common prefix: go on after everything under it
        rest = start[len(prefix) :]
        scan_from = prefix + rest[: rest.find(delimiter) + len(delimiter)] + "\U0010ffff"
    while max_keys:  # max-keys=0: an empty page that is not truncated, as S3 answers
        batch = list(store.scan(bucket, prefix, scan_from, 1000))
        if not batch:
            break
        for key, size, etag, modified in batch:
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            if delimiter:
                rest = key[len(prefix) :]
                cut = rest.find(delimiter)
                if cut >= 0:
                    common = prefix + rest[: cut + len(delimiter)]
                    if not prefixes or prefixes[-1] != common:
                        prefixes.append(common)
                    last = common
                    # skip everything under this common prefix
                    scan_from = common + "\U0010ffff"
                    break
            contents.append((key, size, etag, modified))
            last = key
            scan_from = key
        else:
            continue
        if truncated:
            break
    return contents, prefixes, truncated, last


def objects(store: ObjectStore, req: Request, bucket: str) -> Response:
    v2 = req.arg("list-type") == "2"
    prefix = req.arg("prefix", "") or ""
    delimiter = req.arg("delimiter", "") or ""
    try:
        max_keys = max(0, min(1000, int(req.arg("max-keys", "1000") or 1000)))
    except ValueError:
        raise ApiError("InvalidArgument", "max-keys must be an integer") from None
    if v2:
        token = req.arg("continuation-token")
        start = urllib.parse.unquote(token) if token else (req.arg("start-after", "") or "")
    else:
        start = req.arg("marker", "") or ""
    encoding = req.arg("encoding-type")
    if encoding not in (None, "url"):
        raise ApiError("InvalidArgument", f"encoding-type {encoding!r}: the only one is 'url'")
    contents, prefixes, truncated, last = _page(store, bucket, prefix, delimiter, start, max_keys)
    enc = (lambda text: urllib.parse.quote(text, safe="/")) if encoding else str
    # ListObjects (v1) echoes Prefix as sent even with encoding-type=url (botocore does
    # not decode it there); ListObjectsV2 encodes it like the keys
    shown_prefix = enc(prefix) if v2 else prefix
    parts = [tag("Name", bucket), tag("Prefix", shown_prefix), tag("MaxKeys", max_keys)]
    if delimiter:
        parts.append(tag("Delimiter", enc(delimiter)))
    if encoding:
        parts.append(tag("EncodingType", encoding))
    parts.append(tag("IsTruncated", "true" if truncated else "false"))
    if v2:
        parts.append(tag("KeyCount", len(contents) + len(prefixes)))
        if req.arg("continuation-token") is not None:
            parts.append(tag("ContinuationToken", req.arg("continuation-token")))
        if req.arg("start-after") is not None:
            parts.append(tag("StartAfter", enc(req.arg("start-after") or "")))
        if truncated:
            parts.append(tag("NextContinuationToken", urllib.parse.quote(last)))
    else:
        parts.append(tag("Marker", enc(start)))
        if truncated:
            parts.append(tag("NextMarker", enc(last)))
    # the owner: always in v1, in v2 only with fetch-owner=true (S3's rule)
    owner = OWNER if not v2 or req.arg("fetch-owner") == "true" else ""
    for key, size, etag, modified in contents:
        parts.append(
            "<Contents>"
            + tag("Key", enc(key))
            + tag("LastModified", iso(modified))
            + tag("ETag", f'"{etag}"')
            + tag("Size", size)
            + owner
            + tag("StorageClass", "STANDARD")
            + "</Contents>"
        )
    for common in prefixes:
        parts.append(f"<CommonPrefixes>{tag('Prefix', enc(common))}</CommonPrefixes>")
    return xml_response("ListBucketResult", "".join(parts), ns=NS)


def uploads(store: ObjectStore, req: Request, bucket: str) -> Response:
    prefix = req.arg("prefix", "") or ""
    key_marker = req.arg("key-marker", "") or ""
    id_marker = req.arg("upload-id-marker", "") or ""
    limit = int_arg(req, "max-uploads", 1000)
    found = store.multipart.uploads(bucket, prefix, key_marker, id_marker, limit)
    truncated = len(found) > limit
    found = found[:limit]
    parts = [
        tag("Bucket", bucket),
        tag("KeyMarker", key_marker),
        tag("UploadIdMarker", id_marker),
        tag("Prefix", prefix),
        tag("MaxUploads", limit),
        tag("IsTruncated", "true" if truncated else "false"),
    ]
    if truncated:
        parts += [tag("NextKeyMarker", found[-1][0]), tag("NextUploadIdMarker", found[-1][1])]
    for upload_key, upload_id, started in found:
        parts.append(
            "<Upload>"
            + tag("Key", upload_key)
            + tag("UploadId", upload_id)
            + tag("StorageClass", "STANDARD")
            + tag("Initiated", iso(started))
            + "</Upload>"
        )
    return xml_response("ListMultipartUploadsResult", "".join(parts), ns=NS)


def parts(store: ObjectStore, req: Request, bucket: str, key: str) -> Response:
    upload_id = req.arg("uploadId") or ""
    marker = int_arg(req, "part-number-marker", 0)
    limit = int_arg(req, "max-parts", 1000)
    _, _, kind, _ = store.multipart.get(upload_id, bucket, key)
    found = [p for p in store.multipart.parts(upload_id, bucket, key) if p[0] > marker]
    truncated = len(found) > limit
    found = found[:limit]
    parts = [
        tag("Bucket", bucket),
        tag("Key", key),
        tag("UploadId", upload_id),
        tag("PartNumberMarker", marker),
        tag("MaxParts", limit),
        tag("IsTruncated", "true" if truncated else "false"),
        tag("StorageClass", "STANDARD"),
    ]
    if kind is not None:  # the upload's checksum, and each part's below
        parts.append(tag("ChecksumAlgorithm", kind.algorithm.upper()))
        parts.append(tag("ChecksumType", kind.type))
    if found:
        parts.append(tag("NextPartNumberMarker", found[-1][0]))
    for number, md5, size, modified, checksum in found:
        parts.append(
            "<Part>"
            + tag("PartNumber", number)
            + tag("LastModified", iso(modified))
            + tag("ETag", f'"{md5}"')
            + tag("Size", size)
            + (tag(kind.member, checksum) if kind is not None and checksum else "")
            + "</Part>"
        )
    return xml_response("ListPartsResult", "".join(parts), ns=NS)


def versions(store: ObjectStore, req: Request, bucket: str) -> Response:
    """ListObjectVersions of a bucket that is not versioned, as S3 answers it: each key's one
    version, ``null``, the latest. Tools that empty a bucket list versions (the suite's own
    cleanup, ``aws s3api``, Terraform's force_destroy); a 501 left them unable to."""
    prefix = req.arg("prefix", "") or ""
    delimiter = req.arg("delimiter", "") or ""
    key_marker = req.arg("key-marker", "") or ""
    version_marker = req.arg("version-id-marker", "") or ""
    if version_marker and version_marker != "null":
        raise ApiError(
            "InvalidArgument",
            f"version-id-marker {version_marker!r}: the only version here is 'null'",
        )
    if version_marker and not key_marker:
        raise ApiError("InvalidArgument", "a version-id-marker needs a key-marker")
    limit = max(0, min(1000, int_arg(req, "max-keys", 1000)))
    encoding = req.arg("encoding-type")
    if encoding not in (None, "url"):
        raise ApiError("InvalidArgument", f"encoding-type {encoding!r}: the only one is 'url'")
    store.bucket_region(bucket)  # NoSuchBucket
    found, prefixes, truncated, last = _page(store, bucket, prefix, delimiter, key_marker, limit)
    enc = (lambda text: urllib.parse.quote(text, safe="/")) if encoding else str
    parts = [
        tag("Name", bucket),
        tag("Prefix", enc(prefix)),
        tag("KeyMarker", enc(key_marker)),
        tag("VersionIdMarker", version_marker),
        tag("MaxKeys", limit),
    ]
    if delimiter:
        parts.append(tag("Delimiter", enc(delimiter)))
    if encoding:
        parts.append(tag("EncodingType", encoding))
    parts.append(tag("IsTruncated", "true" if truncated else "false"))
    if truncated:
        parts += [tag("NextKeyMarker", enc(last)), tag("NextVersionIdMarker", "null")]
    for key, size, etag, modified in found:
        parts.append(
            "<Version>"
            + tag("Key", enc(key))
            + tag("VersionId", "null")
            + tag("IsLatest", "true")
            + tag("LastModified", iso(modified))
            + tag("ETag", f'"{etag}"')
            + tag("Size", size)
            + OWNER
            + tag("StorageClass", "STANDARD")
            + "</Version>"
        )
    for common in prefixes:
        parts.append(f"<CommonPrefixes>{tag('Prefix', enc(common))}</CommonPrefixes>")
    return xml_response("ListVersionsResult", "".join(parts), ns=NS)
