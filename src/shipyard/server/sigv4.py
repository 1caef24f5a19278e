"""SigV4: which service a request is for, and whether its signature is right.

Every AWS SDK signs with a credential scope ``<key>/<date>/<region>/<service>/aws4_request``
in the ``Authorization`` header (or ``X-Amz-Credential`` in a presigned URL's query); the
service name routes the request. ``verify`` recomputes the signature for a configured
secret key (AWS's algorithm, documented in "Create a signed AWS API request") and refuses
a request whose ``X-Amz-Date`` is more than five minutes off, as AWS does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from shipyard.server.errors import ApiError

_AUTH = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9a-f]+)"
)
MAX_SKEW = dt.timedelta(minutes=5)
UNSIGNED = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True)
class Scope:
    access_key: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    presigned: bool


def scope(headers: Mapping[str, str], query: dict[str, list[str]]) -> Scope | None:
    """The credential scope of a signed request; None when the request is not signed."""
    auth = headers.get("authorization", "")
    match = _AUTH.match(auth)
    if match:
        cred, signed, sig, presigned = match["cred"], match["signed"], match["sig"], False
    elif "X-Amz-Credential" in query:
        cred = query["X-Amz-Credential"][0]
        signed = query.get("X-Amz-SignedHeaders", [""])[0]
        sig = query.get("X-Amz-Signature", [""])[0]
        presigned = True
    else:
        return None
    parts = cred.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise ApiError(
            "IncompleteSignature", f"credential scope {cred!r} is not key/date/region/service"
        )
    return Scope(parts[0], parts[1], parts[2], parts[3], tuple(signed.split(";")), sig, presigned)


def _uri_encode(text: str, keep_slash: bool) -> str:
    return urllib.parse.quote(text, safe="/~" if keep_slash else "~")


def canonical_request(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    signed: tuple[str, ...],
    payload_hash: str,
    service: str,
) -> str:
    path = raw_path or "/"
    if service != "s3":  # every service but S3 encodes the (already encoded) path again
        path = _uri_encode(path, keep_slash=True)
    pairs = [
        (urllib.parse.unquote(k), urllib.parse.unquote(v))
        for k, _, v in (p.partition("=") for p in raw_query.split("&") if p)
    ]
    query = "&".join(
        f"{_uri_encode(k, False)}={_uri_encode(v, False)}"
        for k, v in sorted(pairs)
        if k != "X-Amz-Signature"
    )
    canon_headers = "".join(
        f"{name}:{' '.join(wire_text(headers.get(name, '')).split())}\n" for name in signed
    )
    return "\n".join([method, path, query, canon_headers, ";".join(signed), payload_hash])


def wire_text(value: str) -> str:
    """A header value as the signer saw it. The HTTP layer reads header bytes as Latin-1
    (so any byte survives); a client signs the text it sent, which it sent as UTF-8
    (botocore does), so the signed text is those bytes read as UTF-8. Bytes that are not
    UTF-8 are kept as surrogates, which :func:`_utf8` turns back into the same bytes."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _key(secret: str, date: str, region: str, service: str) -> bytes:
    key = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


MAX_EXPIRES = 7 * 24 * 3600  # a week, as S3


def _expires(value: str) -> int:
    """X-Amz-Expires: whole seconds, 1 to a week (S3's bounds and error)."""
    try:
        seconds = int(value)
    except ValueError:
        seconds = -1
    if not 1 <= seconds <= MAX_EXPIRES:
        raise ApiError(
            "AuthorizationQueryParametersError",
            f"X-Amz-Expires must be a number of seconds from 1 to {MAX_EXPIRES}, not {value!r}",
        )
    return seconds


def verify(
    sc: Scope,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    body_hash: str,
    keys: Mapping[str, str],
    now: dt.datetime | None = None,
) -> None:
    """Raise ApiError unless the request is signed by a configured key, recently."""
    secret = keys.get(sc.access_key)
    if secret is None:
        raise ApiError(
            "InvalidClientTokenId", f"the access key {sc.access_key!r} is not known here", 403
        )
    query = urllib.parse.parse_qs(raw_query, keep_blank_values=True)
    stamp = query.get("X-Amz-Date", [""])[0] if sc.presigned else headers.get("x-amz-date", "")
    try:
        when = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise ApiError("IncompleteSignature", "the request has no valid X-Amz-Date", 403) from None
    now = now or dt.datetime.now(dt.timezone.utc)
    if sc.presigned:
        expires = _expires(query.get("X-Amz-Expires", [""])[0])
        if not when <= now + MAX_SKEW or now > when + dt.timedelta(seconds=expires):
            raise ApiError(
                "AccessDenied",
                f"the presigned URL expired (signed at {stamp}, valid {expires} s); make a new one",
                403,
            )
        payload = UNSIGNED
    else:
        if abs(now - when) > MAX_SKEW:
            raise ApiError(
                "RequestExpired",
                f"the request was signed at {stamp}, more than 5 minutes from the server's "
                "clock; check the client's clock",
                403,
            )
        payload = headers.get("x-amz-content-sha256") or body_hash
    if "host" not in sc.signed_headers:
        raise ApiError("IncompleteSignature", "the Host header must be signed", 403)
    canon = canonical_request(
        method, raw_path, raw_query, headers, sc.signed_headers, payload, sc.service
    )
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            stamp,
            f"{sc.date}/{sc.region}/{sc.service}/aws4_request",
            hashlib.sha256(_utf8(canon)).hexdigest(),
        ]
    )
    expected = hmac.new(
        _key(secret, sc.date, sc.region, sc.service), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, sc.signature):
        raise ApiError(
            "SignatureDoesNotMatch",
            "the request signature does not match the one computed with the configured "
            "secret key; check AWS_SECRET_ACCESS_KEY",
            403,
        )
