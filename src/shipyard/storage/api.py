"""The Store interface: what channels, artifacts and checkpoints need from storage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Protocol

from shipyard.storage.uri import Location


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a channel: where it is, its size, and the path it gets inside the
    channel directory (``relative``, '/'-separated)."""

    location: Location
    size: int
    relative: str

    @property
    def uri(self) -> str:
        return self.location.uri


class Store(Protocol):
    def list(self, prefix: Location) -> list[ObjectInfo]:
        """Objects under ``prefix`` (S3 prefix semantics / a directory or one file),
        sorted by key; ``relative`` is the path below the prefix's "directory"."""

    def info(self, location: Location) -> ObjectInfo:
        """One object (raises StorageError when it does not exist)."""

    def open(self, location: Location) -> BinaryIO:
        """A stream of the object's bytes (sequential reads)."""

    def read_range(self, location: Location, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end of the object)."""

    def download(self, obj: ObjectInfo, dest: str) -> None:
        """Write the object to ``dest`` atomically (temporary name, then rename)."""

    def upload(self, path: str, location: Location) -> None:
        """Put a local file at ``location``."""

    def delete(self, location: Location) -> None:
        """Remove one object if it exists."""

    def exists(self, location: Location) -> bool:
        """Whether the object (or file) at ``location`` exists."""

    def bucket_exists(self, location: Location) -> bool:
        """Whether the bucket / directory that would hold ``location`` exists."""
