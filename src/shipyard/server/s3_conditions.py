"""S3's preconditions: ``If-Match``, ``If-None-Match``, ``If-Modified-Since`` and
``If-Unmodified-Since`` on GET and HEAD, and their ``x-amz-copy-source-if-*`` twins on a
copy's source.

Why a module of its own: a cache or a sync tool (``aws s3 sync``, a notebook re-downloading
a model only when it changed) relies on these answers; ignoring them hands back a full body
where S3 says 304, or copies an object the caller asked not to copy. S3 evaluates them as
RFC 7232 says, which is what :func:`check` does: a true ``If-Match`` makes
``If-Unmodified-Since`` irrelevant, and a false ``If-None-Match`` makes ``If-Modified-Since``
irrelevant. Dates have whole-second precision, as ``Last-Modified`` has.
"""

from __future__ import annotations

import datetime as dt
import email.utils
from collections.abc import Mapping

from shipyard.server.errors import ApiError

COPY_SOURCE = "x-amz-copy-source-"


def check(headers: Mapping[str, str], etag: str, modified: float, prefix: str = "") -> None:
    """Raise S3's answer when a precondition fails: 412 PreconditionFailed, or 304 Not
    Modified for a read whose ``If-None-Match``/``If-Modified-Since`` says the caller
    already has it (a copy's source answers 412 for those too, as S3 does)."""
    seconds = int(modified)
    if_match = headers.get(prefix + "if-match")
    if if_match is not None:
        if not etag_matches(if_match, etag):
            raise _failed(prefix, "if-match", f"the object's ETag is {etag!r}")
    else:
        since = _date(headers.get(prefix + "if-unmodified-since"))
        if since is not None and seconds > since:
            raise _failed(prefix, "if-unmodified-since", "the object changed after that date")
    if_none = headers.get(prefix + "if-none-match")
    if if_none is not None:
        if etag_matches(if_none, etag):
            raise _unchanged(prefix, "if-none-match")
    else:
        since = _date(headers.get(prefix + "if-modified-since"))
        if since is not None and seconds <= since:
            raise _unchanged(prefix, "if-modified-since")


def etag_matches(header: str, etag: str) -> bool:
    """Whether an ``If-Match``/``If-None-Match`` list (``*``, quoted or bare, ``W/``)
    names this ETag."""
    for item in header.split(","):
        item = item.strip().removeprefix("W/").strip('"')
        if item == "*" or item == etag:
            return True
    return False


def _date(value: str | None) -> float | None:
    """An HTTP date; an unreadable one is ignored, as RFC 7232 and S3 do."""
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if parsed.tzinfo is None:  # "-0000": UTC without a claim about local time
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


def _failed(prefix: str, header: str, why: str) -> ApiError:
    return ApiError(
        "PreconditionFailed",
        f"the precondition {prefix}{header} does not hold ({why}); nothing was returned or changed",
        412,
    )


def _unchanged(prefix: str, header: str) -> ApiError:
    if prefix:  # a copy whose source the caller asked not to copy
        return _failed(prefix, header, "the source is the one named")
    return ApiError("NotModified", "Not Modified", 304)
