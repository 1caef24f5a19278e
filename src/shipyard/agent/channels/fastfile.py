"""FastFile mode: the script starts at once; objects are fetched as they are read.

For s3:// channels the channel directory is a read-only FUSE mount (``fuse.py``): the
whole listing is visible immediately, with exact sizes, and a read fetches only the
8 MiB chunks it touches (ranged GETs, cached on local disk under the instance's agent
dir, the next chunk prefetched for sequential readers). Files never opened are never
downloaded. Local sources need no fetching and are linked as in File mode.

Limits: FUSE needs /dev/fuse and mount rights (root/CAP_SYS_ADMIN, no fusermount
helper); where that is missing the channel is staged like File mode before the script
starts, and the log says so. The mount is read-only (like SageMaker's), and a random
read far into a file fetches only the chunks it touches.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shipyard import settings
from shipyard.agent.channels import fuse
from shipyard.storage import ObjectInfo, Store


class ChunkCache:
    """Chunks of objects fetched on demand into sparse local files."""

    def __init__(self, store: Store, cache_dir: str) -> None:
        self.store = store
        self.cache_dir = cache_dir
        os.makedirs(cache_dir, exist_ok=True)
        self.have: set[tuple[int, int]] = set()
        self.locks: dict[tuple[int, int], threading.Lock] = {}
        self.guard = threading.Lock()
        self.fetched_bytes = 0
        self.fetched_objects: set[str] = set()
        self.prefetch = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fastfile-ahead")
        self.chunk = settings.integer("SHIPYARD_FASTFILE_CHUNK")

    def _path(self, node: fuse.Node) -> str:
        return os.path.join(self.cache_dir, str(node.ino))

    def _ensure(self, node: fuse.Node, chunk: int) -> None:
        key = (node.ino, chunk)
        if key in self.have:
            return
        with self.guard:
            lock = self.locks.setdefault(key, threading.Lock())
        with lock:
            if key in self.have:
                return
            obj: ObjectInfo = node.payload  # type: ignore[assignment]
            start = chunk * self.chunk
            data = self.store.read_range(obj.location, start, min(self.chunk, node.size - start))
            fd = os.open(self._path(node), os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, data, start)
            finally:
                os.close(fd)
            with self.guard:
                self.have.add(key)
                self.fetched_bytes += len(data)
                self.fetched_objects.add(obj.relative)

    def read(self, node: fuse.Node, offset: int, size: int) -> bytes:
        if size <= 0:
            return b""
        first, last = offset // self.chunk, (offset + size - 1) // self.chunk
        for chunk in range(first, last + 1):
            self._ensure(node, chunk)
        if (last + 1) * self.chunk < node.size and (node.ino, last + 1) not in self.have:
            self.prefetch.submit(self._ensure, node, last + 1)
        fd = os.open(self._path(node), os.O_RDONLY)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)


def mount(
    store: Store,
    objects: list[ObjectInfo],
    target: str,
    cache_dir: str,
    name: str,
    log: Callable[[str], None],
) -> tuple[fuse.FuseMount, ChunkCache]:
    os.makedirs(target, exist_ok=True)
    nodes = fuse.build_tree([(o.relative, o.size, o) for o in objects])
    cache = ChunkCache(store, cache_dir)
    fs = fuse.FuseMount(target, nodes, cache.read, name=f"shipyard-{name}", log=log)
    fs.mount()
    return fs, cache
