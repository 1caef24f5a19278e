"""The object store's multipart uploads: parts kept under ``uploads/<id>/`` until the upload
is completed (concatenated into one object) or aborted; everything survives a restart.

Split from :mod:`shipyard.server.objects` when uploads gained checksums (issue 38). Each
part is ``NNNNN`` (its bytes), ``NNNNN.md5`` (its ETag) and, for an upload created with a
checksum algorithm, ``NNNNN.sum`` (the part's checksum, computed by the server as it was
received); a re-uploaded part replaces all three. The upload's algorithm and type are the
``checksum`` column of the ``uploads`` table (``sha256/COMPOSITE``; ``''`` for none, NULL
for an upload a version before this one started, whose Complete is not checked against
checksums it never kept). A completed object keeps its parts' sizes and checksums beside
its file (``objects.PARTS``) for GET ?partNumber and GetObjectAttributes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
import uuid
import zlib
from collections.abc import Mapping
from typing import Protocol

from shipyard.server import s3_checksums
from shipyard.server.errors import ApiError
from shipyard.server.local_db import LocalDb
from shipyard.server.object_record import Obj
from shipyard.server.s3_checksums import UploadChecksum
from shipyard.server.s3_conditions import Precondition


class Store(Protocol):
    """What uploads use of the object store (``objects.ObjectStore``)."""

    root: str
    _db: LocalDb

    def bucket_region(self, name: str) -> str: ...

    def current(self, bucket: str, key: str) -> tuple[str, float, int] | None: ...

    def get(self, bucket: str, key: str) -> Obj: ...

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
    ) -> Obj: ...


CHUNK = 1 << 20
MIN_PART = 5 << 20  # every part but the last, as S3 (EntityTooSmall)
COMPLETED_KEPT = 24 * 3600  # how long a completed upload answers a repeated Complete
# a listed part: (number, ETag, the Checksum* members it was listed with)
Listed = tuple[int, str, Mapping[str, str]]


class UploadStore:
    """Multipart uploads of an ``ObjectStore`` (its index, its data directory)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = store.root
        self._db = store._db
        self._migrate()

    def _migrate(self) -> None:
        """A store written before uploads kept checksums gains the column (NULL in the
        uploads it holds: started without one)."""
        with self._db() as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(uploads)")}
            if "checksum" not in columns:
                try:
                    db.execute("ALTER TABLE uploads ADD COLUMN checksum TEXT")
                except sqlite3.OperationalError:  # another process added it meanwhile
                    pass

    def start(
        self,
        bucket: str,
        key: str,
        content_type: str | None,
        meta: dict,
        checksum: UploadChecksum | None = None,
    ) -> str:
        self.store.bucket_region(bucket)
        upload_id = uuid.uuid4().hex
        os.makedirs(os.path.join(self.root, "uploads", upload_id))
        kept = f"{checksum.algorithm}/{checksum.type}" if checksum else ""
        with self._db() as db:
            db.execute(
                "INSERT INTO uploads (id, bucket, key, content_type, meta, created, checksum) "
                "VALUES (?,?,?,?,?,?,?)",
                (
                    upload_id,
                    bucket,
                    key.encode(),
                    content_type,
                    json.dumps(meta),
                    time.time(),
                    kept,
                ),
            )
        return upload_id

    def get(
        self, upload_id: str, bucket: str, key: str
    ) -> tuple[str | None, dict, UploadChecksum | None, bool]:
        """(content type, metadata, checksum, whether the checksum is known): NoSuchUpload
        when there is no such upload of (bucket, key)."""
        with self._db() as db:
            row = db.execute(
                "SELECT bucket, key, content_type, meta, checksum FROM uploads WHERE id=?",
                (upload_id,),
            ).fetchone()
        if row is None or row[0] != bucket or bytes(row[1]).decode() != key:
            raise ApiError(
                "NoSuchUpload", f"no multipart upload {upload_id!r} for s3://{bucket}/{key}", 404
            )
        checksum = None
        if row[4]:
            algorithm, _, kind = row[4].partition("/")
            checksum = UploadChecksum(algorithm, kind)
        return row[2], json.loads(row[3] or "{}"), checksum, row[4] is not None

    def put_part(
        self,
        upload_id: str,
        bucket: str,
        key: str,
        number: int,
        tmp: str,
        md5: str,
        checksum: str = "",
    ) -> None:
        """Keep part ``number`` (a re-upload replaces its bytes, ETag and checksum)."""
        try:
            self.get(upload_id, bucket, key)
            if not 1 <= number <= 10000:
                raise ApiError("InvalidArgument", "part numbers go from 1 to 10000")
        except ApiError:
            os.unlink(tmp)
            raise
        base = os.path.join(self.root, "uploads", upload_id, f"{number:05d}")
        os.replace(tmp, base)
        if checksum:
            _write(base + ".sum", checksum)
        else:
            _unlink(base + ".sum")
        _write(base + ".md5", md5)

    def complete(
        self,
        upload_id: str,
        bucket: str,
        key: str,
        parts: list[Listed],
        cond: Precondition | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Obj:
        """Concatenate the parts into the object, only if ``cond`` (If-None-Match: *,
        If-Match) holds: checked before the parts are read and again as the object is
        committed; a refused Complete keeps the upload, as S3 does. An upload created with
        a checksum checks the parts' listed checksums and a whole-object one in
        ``headers`` and gives the object its checksum (s3_checksums). A Complete repeated
        after success (a client retrying a response it lost) answers the object it made, as
        S3 does, while that object is still the one the upload wrote."""
        try:
            content_type, meta, kind, known = self.get(upload_id, bucket, key)
        except ApiError as err:
            done = self._completed(upload_id, bucket, key)
            if done is None:
                raise err from None
            return done
        if cond:
            cond.check(key, self.store.current(bucket, key), early=True)
        part_dir = os.path.join(self.root, "uploads", upload_id)
        if not parts or [n for n, _, _ in parts] != sorted({n for n, _, _ in parts}):
            raise ApiError("InvalidPartOrder", "list the parts once each, in ascending order")
        digests = b""
        sizes: list[int] = []
        sums: list[str] = []
        crc = 0
        tmp = os.path.join(self.root, "tmp", uuid.uuid4().hex)
        try:
            with open(tmp, "wb") as out:
                for index, (number, etag, listed) in enumerate(parts):
                    path = os.path.join(part_dir, f"{number:05d}")
                    md5 = _read(path + ".md5")
                    if md5 is None:
                        raise ApiError("InvalidPart", f"part {number} was not uploaded")
                    if etag.strip('"') != md5:
                        raise ApiError("InvalidPart", f"part {number}'s ETag does not match")
                    if kind is not None:
                        kept = _read(path + ".sum") or ""
                        s3_checksums.check_listed(kind, number, listed, kept)
                        sums.append(kept)
                    elif known and any(name.startswith("Checksum") for name in listed):
                        raise ApiError(
                            "InvalidPart",
                            f"part {number} is listed with a checksum, but the upload was "
                            "created without one (x-amz-checksum-algorithm)",
                        )
                    digests += bytes.fromhex(md5)
                    sizes.append(os.path.getsize(path))
                    if index < len(parts) - 1 and sizes[-1] < MIN_PART:
                        raise ApiError(
                            "EntityTooSmall",
                            f"part {number} is {sizes[-1]} bytes; every part but the last "
                            f"must be at least {MIN_PART} bytes (5 MiB); the upload is kept",
                        )
                    with open(path, "rb") as fh:
                        while chunk := fh.read(CHUNK):
                            out.write(chunk)
                            if kind is not None and kind.type == s3_checksums.FULL_OBJECT:
                                crc = zlib.crc32(chunk, crc)
            layout: dict = {"sizes": sizes}
            if kind is not None:
                made = s3_checksums.combine(kind, sums, crc)
                s3_checksums.check_whole(kind, headers or {}, made)
                meta = meta | {kind.header: made, "x-amz-checksum-type": kind.type}
                layout["checksums"] = sums
        except BaseException:
            _unlink(tmp)
            raise
        etag = f"{hashlib.md5(digests).hexdigest()}-{len(parts)}"
        obj = self.store.commit(bucket, key, tmp, etag, content_type, meta, cond, parts=layout)
        now = time.time()
        with self._db() as db:
            db.execute("DELETE FROM completed WHERE created < ?", (now - COMPLETED_KEPT,))
            db.execute(
                "INSERT OR REPLACE INTO completed VALUES (?,?,?,?,?)",
                (upload_id, bucket, key.encode(), etag, now),
            )
        self.abort(upload_id, bucket, key)
        return obj

    def _completed(self, upload_id: str, bucket: str, key: str) -> Obj | None:
        """The object a finished upload made, if it is still there unchanged."""
        with self._db() as db:
            row = db.execute(
                "SELECT bucket, key, etag FROM completed WHERE id=?", (upload_id,)
            ).fetchone()
        if row is None or row[0] != bucket or bytes(row[1]).decode() != key:
            return None
        try:
            obj = self.store.get(bucket, key)
        except ApiError:
            return None
        return obj if obj.etag == row[2] else None

    def uploads(
        self, bucket: str, prefix: str, key_marker: str, id_marker: str, limit: int
    ) -> list[tuple[str, str, float]]:
        """In-progress uploads (key, id, started) after the markers, in (key, id) order:
        what ListMultipartUploads answers, so a cleanup finds what a crash left."""
        self.store.bucket_region(bucket)
        with self._db() as db:
            rows = db.execute(
                "SELECT key, id, created FROM uploads WHERE bucket=? AND key>=? ORDER BY key, id",
                (bucket, max(prefix, key_marker).encode()),
            ).fetchall()
        out = []
        for key_b, upload_id, created in rows:
            key = bytes(key_b).decode()
            if not key.startswith(prefix):
                break
            if key_marker and (key, upload_id) <= (key_marker, id_marker or "\uffff"):
                continue
            out.append((key, upload_id, created or 0.0))
            if len(out) > limit:
                break
        return out

    def parts(
        self, upload_id: str, bucket: str, key: str
    ) -> list[tuple[int, str, int, float, str]]:
        """(number, md5, size, modified, checksum or '') of an upload's parts, in order."""
        self.get(upload_id, bucket, key)
        part_dir = os.path.join(self.root, "uploads", upload_id)
        out = []
        for name in sorted(os.listdir(part_dir)):
            if not name.isdigit():
                continue
            path = os.path.join(part_dir, name)
            md5 = _read(path + ".md5")
            try:
                st = os.stat(path)
            except OSError:
                continue
            if md5 is None:
                continue  # a part being replaced right now
            out.append((int(name), md5, st.st_size, st.st_mtime, _read(path + ".sum") or ""))
        return out

    def abort(self, upload_id: str, bucket: str, key: str) -> None:
        self.get(upload_id, bucket, key)
        with self._db() as db:
            db.execute("DELETE FROM uploads WHERE id=?", (upload_id,))
        shutil.rmtree(os.path.join(self.root, "uploads", upload_id), ignore_errors=True)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    """Replace ``path`` whole (a reader sees the old text or the new, never a part)."""
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
