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
from dataclasses import dataclass

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


def http_date(value: str | None) -> float | None:
    """An HTTP date's timestamp, or None when absent or unreadable."""
    return _date(value)


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


@dataclass(frozen=True)
class Precondition:
    """What a write or a delete requires of the object it replaces or removes (S3's
    conditional writes and deletes): ``If-None-Match: *`` (no object has the key),
    ``If-None-Match`` naming ETags on a write (``if_none_etag``: the object, if any, has none
    of them), ``If-Match`` (the object has one of these ETags, or any with ``*``) and, on
    deletes, ``x-amz-if-match-last-modified-time`` and ``x-amz-if-match-size``.

    Why a value and not a check done once: the store evaluates it inside the transaction
    that writes or deletes (:meth:`ObjectStore.commit`, ``delete``), so a concurrent writer
    cannot slip between the check and the change; the S3 layer also evaluates it before it
    reads a body or concatenates parts (``early``), so a doomed upload is refused at once.
    """

    if_none_match: bool = False
    if_match: str | None = None
    modified: float | None = None
    size: int | None = None
    if_none_etag: str | None = None

    @property
    def needs_object(self) -> bool:
        return self.if_match is not None or self.modified is not None or self.size is not None

    def __bool__(self) -> bool:
        return self.if_none_match or self.if_none_etag is not None or self.needs_object

    def check(self, key: str, current: tuple[str, float, int] | None, early: bool) -> None:
        """Raise S3's answer unless ``current`` ((etag, modified, size) or None) satisfies
        this. Missing object: NoSuchKey when found missing up front, 409
        ConditionalRequestConflict when it went away while the request was under way (S3's
        answer to a delete racing a conditional write); any other mismatch is 412."""
        if current is None:
            if not self.needs_object:
                return
            if early:
                raise ApiError("NoSuchKey", f"no object {key!r} (the request's If-Match)", 404)
            raise ApiError(
                "ConditionalRequestConflict",
                f"the object {key!r} was deleted while this conditional request was under "
                "way; nothing was changed (retry it)",
                409,
            )
        etag, modified, size = current
        if self.if_none_match:
            raise ApiError(
                "PreconditionFailed",
                f"If-None-Match: * and the object {key!r} exists; nothing was written",
                412,
            )
        why = ""
        if self.if_none_etag is not None and etag_matches(self.if_none_etag, etag):
            why = f"If-None-Match {self.if_none_etag!r} and the object's ETag is {etag!r}"
        elif self.if_match is not None and not etag_matches(self.if_match, etag):
            why = f"If-Match {self.if_match!r} and the object's ETag is {etag!r}"
        elif self.modified is not None and int(modified) != int(self.modified):
            why = "x-amz-if-match-last-modified-time is not the object's Last-Modified"
        elif self.size is not None and size != self.size:
            why = f"x-amz-if-match-size {self.size} and the object has {size} bytes"
        if why:
            raise ApiError(
                "PreconditionFailed", f"{why} (object {key!r}); nothing was changed", 412
            )


def write_precondition(headers: Mapping[str, str], delete: bool = False) -> Precondition:
    """A write's (PutObject, CopyObject's destination, CompleteMultipartUpload) or a
    delete's preconditions from its headers. ``If-None-Match`` on a write is ``*`` (no
    object) or ETags (not one of them: a write never replaces what the caller said it must
    not, as ceph/s3-tests' PutObject tests expect); a delete takes none (NotImplemented,
    as S3 answers)."""
    if_none = headers.get("if-none-match")
    if if_none is not None and delete:
        raise ApiError(
            "NotImplemented",
            "If-None-Match on a delete is not a condition S3 evaluates; nothing was deleted",
            501,
        )
    star = if_none is not None and if_none.strip() == "*"
    etags = if_none if if_none is not None and not star else None
    modified = size = None
    if delete:
        modified = _date(headers.get("x-amz-if-match-last-modified-time"))
        if "x-amz-if-match-size" in headers:
            try:
                size = int(headers["x-amz-if-match-size"])
            except ValueError:
                raise ApiError("InvalidArgument", "x-amz-if-match-size is not a number") from None
    return Precondition(star, headers.get("if-match"), modified, size, etags)
