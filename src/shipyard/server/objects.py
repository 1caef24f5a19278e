"""The server's object store: S3 buckets and objects on disk under ``$SHIPYARD_HOME/s3``.

Objects' bytes are plain files (``data/<2 hex>/<uuid>``), written to a temporary file
and renamed into place, so a reader never sees half an object and a crash leaves no
torn one; an SQLite index (``s3/index.db``, WAL) maps (bucket, key) to file, size, ETag
and metadata. Keys are arbitrary (``a`` and ``a/b`` can both exist, as in S3), which a
key-as-path layout could not hold; listing is a range scan on the index, in S3's
UTF-8 byte order. Multipart uploads (``object_uploads``, ``store.multipart``) keep their
parts under ``uploads/<id>/`` until completed or aborted. Everything survives a restart.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from shipyard.server.errors import ApiError
from shipyard.server.local_db import LocalDb
from shipyard.server.object_record import Obj
from shipyard.server.object_uploads import UploadStore
from shipyard.server.s3_checks import Digests
from shipyard.server.s3_conditions import Precondition

_SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (name TEXT PRIMARY KEY, region TEXT, created REAL);
CREATE TABLE IF NOT EXISTS objects (
    bucket TEXT NOT NULL, key BLOB NOT NULL, file TEXT NOT NULL, size INTEGER NOT NULL,
    etag TEXT NOT NULL, modified REAL NOT NULL, content_type TEXT, meta TEXT,
    PRIMARY KEY (bucket, key)
);
CREATE TABLE IF NOT EXISTS uploads (
    id TEXT PRIMARY KEY, bucket TEXT NOT NULL, key BLOB NOT NULL, content_type TEXT,
    meta TEXT, created REAL, checksum TEXT
);
CREATE TABLE IF NOT EXISTS completed (
    id TEXT PRIMARY KEY, bucket TEXT NOT NULL, key BLOB NOT NULL, etag TEXT NOT NULL,
    created REAL
);
"""
# S3's rules: 3-63 characters, dot-separated labels of lowercase letters, digits and '-'
# that start and end with a letter or digit ("a.-b", "a..b" are not names), not an IPv4
# address, not one of the prefixes and suffixes S3 keeps for itself
BUCKET_NAME = re.compile(
    r"^(?=.{3,63}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$"
)
IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
CHUNK = 1 << 20
MAX_OBJECT = 5 << 30
# beside a multipart object's file: its parts' sizes and checksums (JSON: {"sizes": [...],
# "checksums": [...]}; a bare list of sizes from the version before checksums)
PARTS = ".parts"


def no_bucket(bucket: str) -> ApiError:
    return ApiError("NoSuchBucket", f"the bucket {bucket!r} does not exist", 404)


class ObjectStore:
    def __init__(self, root: str) -> None:
        self.root = root
        for sub in ("data", "uploads", "tmp"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        self.db_path = os.path.join(root, "index.db")
        self._db = LocalDb(self.db_path, _SCHEMA)
        self.multipart = UploadStore(self)  # multipart uploads (object_uploads.py)

    # -- buckets --------------------------------------------------------------------------
    def create_bucket(self, name: str, region: str) -> None:
        """A new bucket. Creating one that exists is BucketAlreadyOwnedByYou (409), except
        in us-east-1, where S3 answers 200 and changes nothing (its legacy rule)."""
        if (
            not BUCKET_NAME.match(name)
            or IPV4.match(name)
            or name.startswith(RESERVED_PREFIXES)
            or name.endswith(RESERVED_SUFFIXES)
        ):
            raise ApiError(
                "InvalidBucketName",
                f"bucket name {name!r}: use 3-63 lowercase letters, digits, '.' and '-', "
                "each dot-separated part starting and ending with a letter or digit, not an "
                "IP address",
            )
        with self._db() as db:
            row = db.execute("SELECT region FROM buckets WHERE name=?", (name,)).fetchone()
            if row and row[0] == region == "us-east-1":
                return
            if row:
                raise ApiError(
                    "BucketAlreadyOwnedByYou", f"the bucket {name!r} already exists", 409
                )
            db.execute("INSERT INTO buckets VALUES (?,?,?)", (name, region, time.time()))

    def bucket_region(self, name: str) -> str:
        with self._db() as db:
            row = db.execute("SELECT region FROM buckets WHERE name=?", (name,)).fetchone()
        if row is None:
            raise no_bucket(name)
        return row[0]

    def buckets(self) -> list[tuple[str, float]]:
        with self._db() as db:
            return list(db.execute("SELECT name, created FROM buckets ORDER BY name"))

    def delete_bucket(self, name: str) -> None:
        self.bucket_region(name)
        with self._db() as db:
            if db.execute("SELECT 1 FROM objects WHERE bucket=? LIMIT 1", (name,)).fetchone():
                raise ApiError(
                    "BucketNotEmpty", f"the bucket {name!r} is not empty; delete its objects", 409
                )
            db.execute("DELETE FROM buckets WHERE name=?", (name,))

    # -- objects --------------------------------------------------------------------------
    def _new_file(self) -> str:
        name = uuid.uuid4().hex
        return os.path.join(self.root, "data", name[:2], name)

    def write_temp(
        self, body: BinaryIO, length: int, digests: Digests | None = None
    ) -> tuple[str, str, str]:
        """Stream ``length`` bytes (-1: to the end of ``body``) into a temporary file:
        (path, md5 hex, sha256 hex). Whatever ends the request early (a short body, a
        client reset, a digest that does not match) removes the file before it is raised:
        an interrupted upload leaves nothing behind."""
        tmp = os.path.join(self.root, "tmp", uuid.uuid4().hex)
        sums = digests or Digests({})
        size = 0
        try:
            with open(tmp, "wb") as fh:
                remaining = length
                while remaining != 0:
                    chunk = body.read(CHUNK if remaining < 0 else min(CHUNK, remaining))
                    if not chunk:
                        break
                    fh.write(chunk)
                    sums.update(chunk)
                    size += len(chunk)
                    if remaining > 0:
                        remaining -= len(chunk)
                    if size > MAX_OBJECT:
                        raise ApiError("EntityTooLarge", "an object (or part) is at most 5 GiB")
            if length >= 0 and size != length:
                raise ApiError(
                    "IncompleteBody", f"the body ended after {size} of {length} bytes", 400
                )
            sums.verify()
        except BaseException:
            _unlink(tmp)
            raise
        return tmp, sums.md5.hexdigest(), sums.sha256.hexdigest()

    def commit(
        self,
        bucket: str,
        key: str,
        tmp: str,
        etag: str,
        content_type: str | None,
        meta: dict[str, str],
        cond: Precondition | None = None,
        parts: dict | None = None,
    ) -> Obj:
        """Move a finished temporary file into place as (bucket, key), only if ``cond``
        (If-None-Match: *, If-Match) holds for the object it replaces: checked in the same
        transaction as the write, so of two racing conditional writes exactly one wins and
        a refused write changes nothing."""
        try:
            self.bucket_region(bucket)
        except ApiError:
            os.unlink(tmp)
            raise
        final = self._new_file()
        os.makedirs(os.path.dirname(final), exist_ok=True)
        size = os.path.getsize(tmp)
        if parts:  # a multipart object's parts, for GET ?partNumber and GetObjectAttributes
            with open(final + PARTS, "w") as fh:
                json.dump(parts, fh)
        os.replace(tmp, final)
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                old = db.execute(
                    "SELECT file, etag, modified, size FROM objects WHERE bucket=? AND key=?",
                    (bucket, key.encode()),
                ).fetchone()
                if cond:
                    cond.check(key, old and (old[1], old[2], old[3]), early=False)
                db.execute(
                    "INSERT OR REPLACE INTO objects VALUES (?,?,?,?,?,?,?,?)",
                    (bucket, key.encode(), final, size, etag, now, content_type, json.dumps(meta)),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                _unlink_object(final)
                raise
        if old and old[0] != final:
            _unlink_object(old[0])
        return Obj(bucket, key, final, size, etag, now, content_type, meta)

    def get(self, bucket: str, key: str) -> Obj:
        with self._db() as db:
            row = db.execute(
                "SELECT file, size, etag, modified, content_type, meta FROM objects "
                "WHERE bucket=? AND key=?",
                (bucket, key.encode()),
            ).fetchone()
        if row is None:
            self.bucket_region(bucket)
            raise ApiError("NoSuchKey", f"no object s3://{bucket}/{key}", 404)
        return Obj(bucket, key, row[0], row[1], row[2], row[3], row[4], json.loads(row[5] or "{}"))

    def delete(self, bucket: str, key: str, cond: Precondition | None = None) -> None:
        """Remove (bucket, key) (nothing to remove is no error, as in S3), only if ``cond``
        (If-Match, last-modified time, size) holds: checked in the delete's transaction. A
        missing object is 204 whatever the condition, as S3's DeleteObject answers ("if the
        ETag matches or if the object doesn't exist ... 204")."""
        self.bucket_region(bucket)
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT file, etag, modified, size FROM objects WHERE bucket=? AND key=?",
                    (bucket, key.encode()),
                ).fetchone()
                if cond and row:
                    cond.check(key, (row[1], row[2], row[3]), early=True)
                db.execute("DELETE FROM objects WHERE bucket=? AND key=?", (bucket, key.encode()))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        if row:
            _unlink_object(row[0])

    def current(self, bucket: str, key: str) -> tuple[str, float, int] | None:
        """(etag, modified, size) of (bucket, key), or None: what a precondition reads."""
        with self._db() as db:
            row = db.execute(
                "SELECT etag, modified, size FROM objects WHERE bucket=? AND key=?",
                (bucket, key.encode()),
            ).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def scan(
        self, bucket: str, prefix: str, start_after: str, limit: int
    ) -> Iterator[tuple[str, int, str, float]]:
        """(key, size, etag, modified) with ``prefix``, after ``start_after``, key order."""
        self.bucket_region(bucket)
        low = max(prefix.encode(), start_after.encode())
        with self._db() as db:
            rows = db.execute(
                "SELECT key, size, etag, modified FROM objects WHERE bucket=? AND key>=? "
                "ORDER BY key LIMIT ?",
                (bucket, low, limit + 1),
            ).fetchall()
        for key_b, size, etag, modified in rows:
            key = bytes(key_b).decode()
            if key == start_after:
                continue
            if not key.startswith(prefix):
                return
            yield key, size, etag, modified

    def sweep_temp(self) -> None:
        """At start: temporary files of requests a previous run did not finish."""
        tmp = os.path.join(self.root, "tmp")
        for name in os.listdir(tmp):
            _unlink(os.path.join(tmp, name))


def _layout(obj: Obj) -> dict:
    try:
        with open(obj.file + PARTS) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {"sizes": data} if isinstance(data, list) else data if isinstance(data, dict) else {}


def part_sizes(obj: Obj) -> list[int] | None:
    """A multipart object's part sizes (None: not kept, e.g. an object from before)."""
    try:
        return [int(n) for n in _layout(obj)["sizes"]]
    except (KeyError, ValueError, TypeError):
        return None


def part_checksums(obj: Obj) -> list[str] | None:
    """A multipart object's parts' checksums, in order (None: its upload had none)."""
    sums = _layout(obj).get("checksums")
    return [str(v) for v in sums] if isinstance(sums, list) else None


def _unlink_object(path: str) -> None:
    _unlink(path)
    _unlink(path + PARTS)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
