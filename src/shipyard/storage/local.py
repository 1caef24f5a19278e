"""LocalStore: a local directory tree (plain paths and file:// URIs)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import BinaryIO

from shipyard.errors import StorageError
from shipyard.storage.api import ObjectInfo
from shipyard.storage.uri import Location


class LocalStore:
    def list(self, prefix: Location) -> list[ObjectInfo]:
        root = prefix.path
        if os.path.isfile(root):
            return [ObjectInfo(prefix, os.path.getsize(root), os.path.basename(root))]
        if not os.path.isdir(root):
            raise StorageError(f"{prefix.uri!r} does not exist")
        out = []
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                out.append(ObjectInfo(Location("file", path=full), os.path.getsize(full), rel))
        return sorted(out, key=lambda o: o.relative)

    def info(self, location: Location) -> ObjectInfo:
        if not os.path.isfile(location.path):
            raise StorageError(f"{location.uri!r} does not exist or is not a file")
        return ObjectInfo(location, os.path.getsize(location.path), os.path.basename(location.path))

    def open(self, location: Location) -> BinaryIO:
        try:
            return open(location.path, "rb")
        except OSError as exc:
            raise StorageError(f"cannot read {location.uri!r}: {exc.strerror}") from None

    def read_range(self, location: Location, start: int, length: int) -> bytes:
        with self.open(location) as fh:
            fh.seek(start)
            return fh.read(length)

    def download(self, obj: ObjectInfo, dest: str) -> None:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".shipyard-")
        os.close(fd)
        try:
            shutil.copyfile(obj.location.path, tmp)
            os.replace(tmp, dest)
        except BaseException:
            os.unlink(tmp)
            raise

    def upload(self, path: str, location: Location) -> None:
        self.download(ObjectInfo(Location("file", path=path), 0, ""), location.path)

    def delete(self, location: Location) -> None:
        try:
            os.unlink(location.path)
        except FileNotFoundError:
            pass

    def exists(self, location: Location) -> bool:
        return os.path.exists(location.path)

    def bucket_exists(self, location: Location) -> bool:
        """A local location can always be created (its directories are made on write)."""
        return True
