"""What an object keeps from the request that writes it: user metadata and the standard
headers S3 stores (split from :mod:`shipyard.server.s3_api`, which PutObject, CopyObject and
CreateMultipartUpload share)."""

from __future__ import annotations

import email.header

from shipyard.server.http import Request

# standard headers an object keeps from its PUT (beside Content-Type and x-amz-meta-*)
STORED_HEADERS = {
    name.lower(): name
    for name in (
        "Cache-Control",
        "Content-Disposition",
        "Content-Encoding",
        "Content-Language",
        "Expires",
    )
}


def request_meta(req: Request) -> dict[str, str]:
    """What an object keeps from the request that writes it: user metadata as text (RFC
    2047 encoded-words decoded and raw UTF-8 bytes, which the HTTP layer read as Latin-1,
    taken as UTF-8, as S3 stores them) and the standard headers S3 keeps (Cache-Control,
    Content-Disposition, Content-Encoding without ``aws-chunked``, Content-Language,
    Expires), under their lower-case names."""
    meta = {k: _meta_text(v) for k, v in req.headers.items() if k.startswith("x-amz-meta-")}
    for name in STORED_HEADERS:
        value = req.headers.get(name)
        if name == "content-encoding" and value is not None and "aws-chunked" in value:
            # kept as sent but for the transfer coding ("deflate, gzip" stays so)
            value = ", ".join(
                part.strip() for part in value.split(",") if part.strip() != "aws-chunked"
            )
        if value:
            meta[name] = value
    return meta


def _meta_text(value: str) -> str:
    if "=?" in value:
        try:
            return str(email.header.make_header(email.header.decode_header(value)))
        except (ValueError, LookupError):
            return value
    if not value.isascii():
        try:
            return value.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return value
    return value
