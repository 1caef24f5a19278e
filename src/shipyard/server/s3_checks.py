"""What S3 refuses before touching data: sub-resources not served, bad keys, wrong digests.

S3 routes on method, path *and* query: ``PUT /b/k?tagging`` is PutObjectTagging, not
PutObject. A server that routes on method and path alone replaces the object with the
tagging XML (and ``DELETE /b?cors`` deletes the bucket). So every query parameter must be
one this server understands; anything else (``tagging``, ``acl``, ``cors``, ``lifecycle``,
``policy``, ``versioning``, ...) is answered with S3's ``NotImplemented`` before a byte is
read or written.

Digests: ``Content-MD5`` and ``x-amz-checksum-{crc32,sha1,sha256}`` are checked against the
bytes received (``BadDigest``; a malformed value is ``InvalidDigest`` for Content-MD5 and
``InvalidRequest`` for a checksum, as S3 answers); CRC32C and CRC64NVME need a
native library botocore only uses when awscrt is installed, and are refused by name.
"""

from __future__ import annotations

import base64
import hashlib
import urllib.parse
import zlib
from collections.abc import Mapping

from shipyard.server.errors import ApiError

# query parameters of the operations served (and the ones every signer or SDK adds)
SERVED_PARAMS = frozenset(
    {
        # ListObjects(V2)
        "list-type",
        "prefix",
        "delimiter",
        "max-keys",
        "marker",
        "continuation-token",
        "start-after",
        "encoding-type",
        "fetch-owner",
        # multipart, batch delete, location
        "uploads",
        "uploadId",
        "partNumber",
        "key-marker",
        "upload-id-marker",
        "max-uploads",
        "max-parts",
        "part-number-marker",
        "delete",
        "location",
        # GetObjectAttributes
        "attributes",
        # ListBuckets' pages
        "max-buckets",
        # ListObjectVersions of an unversioned bucket (each key's one version, null)
        "versions",
        "version-id-marker",
        # GetObject's response overrides
        "response-content-type",
        "response-content-disposition",
        "response-content-encoding",
        "response-content-language",
        "response-cache-control",
        "response-expires",
        # botocore's operation hint, presigned URLs
        "x-id",
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
        "X-Amz-Security-Token",
        "X-Amz-Content-Sha256",
        "versionId",
    }
)
MAX_KEY_BYTES = 1024
MAX_DELETE_KEYS = 1000
CHECKSUMS = ("crc32", "sha1", "sha256")
UNVERIFIED_CHECKSUMS = ("crc32c", "crc64nvme")


def check_sub_resources(method: str, query: Mapping[str, list[str]]) -> None:
    """NotImplemented for any sub-resource or parameter this server does not serve."""
    unknown = sorted(name for name in query if name not in SERVED_PARAMS)
    if unknown:
        raise ApiError(
            "NotImplemented",
            f"{method} ?{unknown[0]} is not implemented by shipyard server (nothing was "
            "changed); it serves objects, listing, multipart uploads, copy and batch delete",
            501,
        )
    version = query.get("versionId", ["null"])[0]
    if version != "null":
        raise ApiError(
            "NotImplemented",
            f"versionId {version!r}: buckets here are not versioned (the only version is 'null')",
            501,
        )


def check_uri(raw_path: str) -> None:
    """S3's keys are UTF-8: a path whose percent-escapes decode to other bytes (``%AE%8A``,
    Latin-1) is 400 InvalidURI with S3's message, not a lookup of the key with each such
    byte replaced by U+FFFD (which answered 404, or wrote under the mangled name)."""
    try:
        urllib.parse.unquote(raw_path, errors="strict")
    except UnicodeDecodeError:
        raise ApiError("InvalidURI", "Couldn't parse the specified URI.") from None


def check_key(key: str) -> None:
    """S3's key rules: at most 1,024 bytes of UTF-8; no NUL (it breaks every listing)."""
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ApiError(
            "KeyTooLongError", f"the key is over S3's limit of {MAX_KEY_BYTES} bytes of UTF-8"
        )
    if "\x00" in key:
        raise ApiError("InvalidArgument", "an object key cannot contain the NUL character")


class Digests:
    """Running digests of a body, and the check of those its headers declare."""

    def __init__(self, headers: Mapping[str, str], want: str | None = None) -> None:
        """``want``: an algorithm whose value is needed whatever the client sends (a
        multipart upload's, kept per part)."""
        self.expected: dict[str, str] = {}
        md5 = headers.get("content-md5")
        if md5 is not None:
            self.expected["md5"] = _b64(md5, "Content-MD5", 16)
        for name in UNVERIFIED_CHECKSUMS:
            if f"x-amz-checksum-{name}" in headers:
                raise ApiError(
                    "NotImplemented",
                    f"x-amz-checksum-{name} is not verified by shipyard server; send "
                    "CRC32, SHA1 or SHA256 (botocore's default is CRC32)",
                    501,
                )
        for name in CHECKSUMS:
            value = headers.get(f"x-amz-checksum-{name}")
            if value is not None:
                size = {"crc32": 4, "sha1": 20, "sha256": 32}[name]
                self.expected[name] = _b64(value, f"x-amz-checksum-{name}", size)
        self.md5 = hashlib.md5()
        self.sha256 = hashlib.sha256()
        # a trailer's checksum is known only after the body: x-amz-trailer names it ahead
        trailer = headers.get("x-amz-trailer", "").lower()
        wants_sha1 = "sha1" in self.expected or "x-amz-checksum-sha1" in trailer or want == "sha1"
        self.sha1 = hashlib.sha1() if wants_sha1 else None
        self.crc32 = 0  # always: zlib's CRC32 costs little beside the disk write

    def update(self, chunk: bytes) -> None:
        self.md5.update(chunk)
        self.sha256.update(chunk)
        if self.sha1 is not None:
            self.sha1.update(chunk)
        self.crc32 = zlib.crc32(chunk, self.crc32)

    def add_trailer(self, name: str, value: str) -> None:
        """A checksum sent after an aws-chunked body (its trailer), checked as a header."""
        name = name.strip().lower()
        if name.startswith("x-amz-checksum-"):
            self.expected.update(Digests({name: value.strip()}).expected)
            if name == "x-amz-checksum-sha1" and self.sha1 is None:
                raise ApiError("NotImplemented", "declare a SHA1 trailer in its header", 501)

    def checksums(self) -> dict[str, str]:
        """The x-amz-checksum-* the body came with (header or trailer), as sent: what the
        object keeps and a GET with x-amz-checksum-mode: ENABLED answers. Call after
        :meth:`verify`."""
        return {f"x-amz-checksum-{k}": v for k, v in self.expected.items() if k != "md5"}

    def _got(self) -> dict[str, bytes]:
        return {
            "md5": self.md5.digest(),
            "sha256": self.sha256.digest(),
            "sha1": self.sha1.digest() if self.sha1 is not None else b"",
            "crc32": self.crc32.to_bytes(4, "big"),
        }

    def value(self, name: str) -> str:
        """The body's ``name`` checksum (crc32, sha1, sha256), base64, as S3 writes it."""
        return base64.b64encode(self._got()[name]).decode()

    def verify(self) -> None:
        got = self._got()
        for name, want in self.expected.items():
            if base64.b64encode(got[name]).decode() != want:
                label = "Content-MD5" if name == "md5" else name.upper()
                raise ApiError(
                    "BadDigest",
                    # S3's own sentence first (clients match on it), then what differed
                    f"The {label} you specified did not match the calculated checksum. "
                    f"The body's is {base64.b64encode(got[name]).decode()}, not the {want} "
                    "sent: it was changed or cut on its way (nothing was stored).",
                )


def _b64(value: str, header: str, size: int) -> str:
    """A digest header's value, normalised; a value that is not the base64 of ``size``
    bytes is refused as S3 refuses it: ``InvalidDigest`` for Content-MD5, 400
    ``InvalidRequest`` "Value for x-amz-checksum-... header is invalid." for the others
    (``BadDigest`` is kept for a well-formed digest the body does not match)."""
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except ValueError:
        raw = b""
    if len(raw) != size:
        if header == "Content-MD5":
            raise ApiError(
                "InvalidDigest", f"{header} {value!r} is not a base64 digest of {size} bytes"
            )
        raise ApiError("InvalidRequest", f"Value for {header} header is invalid.")
    return base64.b64encode(raw).decode()


# Request headers asking for a feature this server does not provide. Accepting one and
# ignoring it lies to the caller (a "locked" object deletes at once; an SSE-C object comes
# back to a GET without its key), so each is refused with S3's NotImplemented, nothing
# changed. header -> (what it asks for, values that ask for nothing and are accepted)
NOT_SERVED_HEADERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "x-amz-object-lock-mode": ("object lock retention", ()),
    "x-amz-object-lock-retain-until-date": ("object lock retention", ()),
    "x-amz-object-lock-legal-hold": ("an object lock legal hold", ("off",)),
    "x-amz-tagging": ("object tagging", ("",)),
    "x-amz-storage-class": ("storage classes other than STANDARD", ("standard",)),
    "x-amz-website-redirect-location": ("website redirects", ("",)),
    "x-amz-server-side-encryption-aws-kms-key-id": ("encryption with a KMS key", ()),
    "x-amz-server-side-encryption-context": ("encryption with a KMS key", ()),
    "x-amz-server-side-encryption-bucket-key-enabled": ("S3 Bucket Keys", ("false",)),
    # SSE-S3 and SSE-KMS with the AWS-managed key: the SageMaker SDK asks for aws:kms on
    # every code bundle and repacked model by default (encrypt_repacked_artifacts); both
    # name a key the service manages, and objects here rest in the owner's private home
    "x-amz-server-side-encryption": ("server-side encryption", ("aes256", "aws:kms")),
}
SSE_C = (
    "x-amz-server-side-encryption-customer-",
    "x-amz-copy-source-server-side-encryption-customer-",
)
WRITES = frozenset({"put_object", "copy_object", "start_upload"})


def check_headers(route: str, headers: Mapping[str, str]) -> None:
    """NotImplemented (501, nothing changed) for a request whose headers ask for what is
    not served: object lock (on CreateBucket and on writes), tagging, storage classes, website
    redirects, KMS keys and SSE-C (customer-provided keys, on any object request)."""
    asked: str | None = None
    if any(name.startswith(SSE_C) for name in headers):
        asked = "server-side encryption with customer-provided keys (SSE-C)"
    elif route == "create_bucket":
        if headers.get("x-amz-bucket-object-lock-enabled", "").strip().lower() == "true":
            asked = "object lock"
    elif route in WRITES:
        for name, (what, harmless) in NOT_SERVED_HEADERS.items():
            value = headers.get(name)
            if value is not None and value.strip().lower() not in harmless:
                asked = f"{what} ({name}: {value[:64]})"
                break
    if asked is not None:
        raise ApiError(
            "NotImplemented",
            f"{asked} is not implemented by shipyard server; nothing was changed",
            501,
        )


def refuse_sigv2(headers: Mapping[str, str], query: Mapping[str, list[str]]) -> None:
    """S3's own answer to a SigV2 request (``Authorization: AWS key:signature``, or a URL
    presigned with ``AWSAccessKeyId``/``Signature``/``Expires``, what a default boto3 client
    in us-east-1 presigns): 400 InvalidRequest naming the mechanism to use, as S3 answers in
    every region opened since 2014, rather than "not signed", which sends the user looking
    for a missing key. ``shipyard server env`` configures clients for SigV4."""
    v2_header = headers.get("authorization", "").startswith("AWS ")
    v2_query = "AWSAccessKeyId" in query and "Signature" in query
    if v2_header or v2_query:
        raise ApiError(
            "InvalidRequest",
            "The authorization mechanism you have provided is not supported. Please use "
            "AWS4-HMAC-SHA256.",
        )
