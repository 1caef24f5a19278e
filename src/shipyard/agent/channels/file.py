"""File mode: the channel's objects are in input/data/<channel>/ before the script starts.

Local sources are linked, not copied, where that is safe: a whole directory is one
symlink (instant, whatever its size); a shard gets one symlink per file. The linked
data is the user's own: a script that writes into its channel writes into it (SageMaker
hands out a copy; copy the data first if a script modifies its input). s3:// objects
are downloaded in parallel (SHIPYARD_DOWNLOAD_THREADS, default 8), each to a temporary
name renamed into place, with progress logged.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shipyard import settings
from shipyard.agent.channels.progress import Progress
from shipyard.storage import ObjectInfo, Store


def safe_join(root: str, relative: str) -> str:
    """``root/relative``, refusing a relative path that climbs out of ``root``."""
    target = os.path.normpath(os.path.join(root, relative))
    if not (target == root or target.startswith(root.rstrip(os.sep) + os.sep)):
        raise ValueError(f"object path {relative!r} would land outside {root}")
    return target


def link_directory(source: str, target: str) -> None:
    """The whole local source as input/data/<channel> (a single file: a dir holding it).

    The link names the source's resolved path: the instance's view holds the path a
    channel resolves to, not a link on the way (``fit({"training": "data"})`` where
    ``data`` links elsewhere, under a /tmp that is private in the instance)."""
    if os.path.islink(target):
        os.remove(target)
    elif os.path.isdir(target):
        return  # materialized by an earlier attempt
    real = os.path.realpath(source)
    if os.path.isdir(real):
        os.symlink(real, target, target_is_directory=True)
    else:
        os.makedirs(target, exist_ok=True)
        link = os.path.join(target, os.path.basename(source))
        if not os.path.lexists(link):
            os.symlink(real, link)


def link_objects(objects: list[ObjectInfo], target: str) -> None:
    """One symlink per local object (a shard of a local directory)."""
    os.makedirs(target, exist_ok=True)
    for obj in objects:
        dest = safe_join(target, obj.relative)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.lexists(dest):
            os.remove(dest)
        os.symlink(os.path.realpath(obj.location.path), dest)  # what the view holds


def unlinked(path: str, log: Callable[[str], None], top: str | None = None) -> None:
    """Make sure a download into the job's tree lands in the tree: a link the job left
    at ``path`` or at a directory between ``top`` and it (an earlier attempt's processes
    could write the tree; none runs while the agent prepares the next) is removed, never
    written through, and said. Without ``top``, ``path`` is the channel's directory."""
    parts = [path] if top is None else _between(top, path)
    for part in parts:
        if os.path.islink(part):
            log(f"removed a link the job left at {part} (-> {os.readlink(part)}): not followed")
            os.remove(part)
            if part != path:
                os.makedirs(part, exist_ok=True)
    if top is None and os.path.realpath(path) != os.path.abspath(path):
        raise ValueError(f"{path} resolves through a link ({os.path.realpath(path)}): refused")


def _between(top: str, path: str) -> list[str]:
    """The directories below ``top`` down to ``path`` itself, outermost first."""
    out = []
    while path != top and path.startswith(top.rstrip(os.sep) + os.sep):
        out.append(path)
        path = os.path.dirname(path)
    return out[::-1]


def download_objects(
    store: Store, objects: list[ObjectInfo], target: str, label: str, log: Callable[[str], None]
) -> Progress:
    """Fetch every object into ``target`` in parallel; objects already there with the
    right size (an earlier attempt) are kept."""
    os.makedirs(target, exist_ok=True)
    unlinked(target, log)
    progress = Progress(label, len(objects), sum(o.size for o in objects), log)
    log(f"{label}: downloading {len(objects)} objects, {progress.total_bytes / 1e6:.1f} MB")

    def fetch(obj: ObjectInfo) -> None:
        dest = safe_join(target, obj.relative)
        unlinked(dest, log, top=target)
        if not (os.path.isfile(dest) and os.path.getsize(dest) == obj.size):
            store.download(obj, dest)
        progress.add(obj.size)

    threads = settings.integer("SHIPYARD_DOWNLOAD_THREADS")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(fetch, obj) for obj in objects]:
            future.result()  # the first failure is raised (the others finish first)
    log(progress.line())
    return progress
