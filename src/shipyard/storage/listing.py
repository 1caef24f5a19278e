"""What a channel's source holds: S3Prefix listings and ManifestFile expansion.

A SageMaker manifest is a JSON list: ``[{"prefix": "s3://bucket/dir/"}, "rel/a", ...]``;
each entry is an object ``prefix + entry``. Entries may not leave the manifest's bucket
(an s3 manifest's prefix must be in the manifest's own bucket) nor, for a local
manifest, climb out of the prefix directory with ``..``.
"""

from __future__ import annotations

import json
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor

from shipyard.errors import StorageError
from shipyard.storage.api import ObjectInfo, Store
from shipyard.storage.uri import Location, parse


def store_for(location: Location | str, endpoint: str | None = None) -> Store:
    loc = parse(location) if isinstance(location, str) else location
    if loc.scheme == "s3":
        from shipyard.storage.s3 import S3Store

        return S3Store(endpoint)
    from shipyard.storage.local import LocalStore

    return LocalStore()


def list_channel(
    uri: str, s3_data_type: str = "S3Prefix", endpoint: str | None = None
) -> list[ObjectInfo]:
    """Every object of a channel, sorted. An s3:// prefix or a manifest with no objects
    is an error (SageMaker refuses it too); an existing empty local directory is not --
    SageMaker local mode mounts it as it is."""
    loc = parse(uri)
    store = store_for(loc, endpoint)
    if s3_data_type == "ManifestFile":
        objects = _manifest_objects(store, loc, endpoint)
    else:
        objects = store.list(loc)
    if not objects and (loc.scheme == "s3" or s3_data_type == "ManifestFile"):
        raise StorageError(f"no objects under {uri!r}: the prefix is empty or wrong")
    return objects


def _manifest_objects(store: Store, loc: Location, endpoint: str | None) -> list[ObjectInfo]:
    with store.open(loc) as fh:
        raw = fh.read()
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise StorageError(f"manifest {loc.uri} is not valid JSON: {exc}") from None
    if (
        not isinstance(entries, list)
        or not entries
        or not isinstance(entries[0], dict)
        or "prefix" not in entries[0]
    ):
        raise StorageError(
            f"manifest {loc.uri} must be a JSON list starting with "
            '{"prefix": "s3://bucket/dir/"} followed by relative keys'
        )
    prefix = parse(str(entries[0]["prefix"]))
    if prefix.scheme != loc.scheme or (loc.scheme == "s3" and prefix.bucket != loc.bucket):
        raise StorageError(
            f"manifest {loc.uri} points outside its bucket: prefix "
            f"{entries[0]['prefix']!r}; a manifest may only name objects in "
            "its own bucket"
        )
    targets = []
    for entry in entries[1:]:
        if not isinstance(entry, str) or not entry:
            raise StorageError(f"manifest {loc.uri}: entry {entry!r} is not a relative key")
        norm = posixpath.normpath(entry)
        if norm.startswith("../") or norm == ".." or entry.startswith("/"):
            raise StorageError(f"manifest {loc.uri}: entry {entry!r} points outside its prefix")
        if prefix.scheme == "s3":
            target = Location("s3", prefix.bucket, prefix.key + entry)
        else:
            target = Location("file", path=os.path.join(prefix.path, norm))
        targets.append((target, entry))
    target_store = store_for(prefix, endpoint)
    with ThreadPoolExecutor(max_workers=16) as pool:
        infos = list(pool.map(lambda t: target_store.info(t[0]), targets))
    return [ObjectInfo(info.location, info.size, rel) for info, (_, rel) in zip(infos, targets)]
