"""A minimal read-only FUSE file system in pure Python (the kernel protocol, no libfuse).

Enough of the protocol for a script to list, stat, open and read a fixed tree of
files: INIT, LOOKUP, GETATTR, OPEN(DIR), READ(DIR), RELEASE(DIR), STATFS, FLUSH, ACCESS;
everything else answers ENOSYS, writes EROFS. File contents come from a callback
``read(node, offset, size) -> bytes``, called on a small thread pool so one slow fetch
does not stall other reads. Mounting needs /dev/fuse and the right to mount(2) (root
or CAP_SYS_ADMIN; there is no fusermount helper here): ``usable()`` says whether it can.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

_IN_HEADER = struct.Struct("<IIQQIIII")
_OUT_HEADER = struct.Struct("<IiQ")
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
_READ_IN = struct.Struct("<QQII")
_OPEN_IN = struct.Struct("<II")

LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH = 1, 2, 3, 14, 15, 17, 18, 25
INIT, OPENDIR, READDIR, RELEASEDIR, ACCESS, INTERRUPT, DESTROY, BATCH_FORGET = (
    26,
    27,
    28,
    29,
    34,
    36,
    38,
    42,
)
_NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}
FOPEN_KEEP_CACHE = 2
MAX_READ = 128 * 1024
MS_RDONLY, MS_NOSUID, MS_NODEV, MNT_DETACH = 1, 2, 4, 2

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Node:
    ino: int
    name: str
    is_dir: bool
    size: int = 0
    children: dict[str, int] = field(default_factory=dict)
    payload: object = None


def build_tree(files: list[tuple[str, int, object]]) -> dict[int, Node]:
    """Nodes for ``[(relative path, size, payload), ...]``; inode 1 is the root."""
    nodes = {1: Node(1, "", True)}
    for rel, size, payload in files:
        parent = nodes[1]
        parts = [p for p in rel.split("/") if p]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            ino = parent.children.get(part)
            if ino is None:
                ino = len(nodes) + 1
                nodes[ino] = Node(
                    ino, part, not last, size if last else 0, payload=payload if last else None
                )
                parent.children[part] = ino
            parent = nodes[ino]
    return nodes


def usable() -> str | None:
    """None when FUSE mounts work here, else the reason they do not."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened ({exc.strerror})"
    if os.geteuid() != 0:
        return "mounting needs root or CAP_SYS_ADMIN (no fusermount helper is used)"
    return None


class FuseMount:
    """Mounts ``nodes`` at ``mountpoint`` and serves requests on a daemon thread."""

    def __init__(
        self,
        mountpoint: str,
        nodes: dict[int, Node],
        read: Callable[[Node, int, int], bytes],
        name: str = "shipyard",
        log: Callable[[str], None] = print,
    ) -> None:
        self.mountpoint = os.path.abspath(mountpoint)
        self.nodes = nodes
        self.read = read
        self.log = log
        self.name = name
        self.fd = -1
        self.now = int(time.time())
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fuse-read")
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def mount(self) -> None:
        self.fd = os.open("/dev/fuse", os.O_RDWR)
        opts = (
            f"fd={self.fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},allow_other"
        )
        rc = _libc.mount(
            self.name.encode(),
            self.mountpoint.encode(),
            b"fuse",
            MS_RDONLY | MS_NOSUID | MS_NODEV,
            opts.encode(),
        )
        if rc != 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            self.fd = -1
            raise OSError(err, f"mount fuse at {self.mountpoint}: {os.strerror(err)}")
        self._thread = threading.Thread(target=self._serve, name=f"fuse-{self.name}", daemon=True)
        self._thread.start()

    def unmount(self) -> None:
        if self.fd < 0:
            return
        _libc.umount2(self.mountpoint.encode(), MNT_DETACH)
        self.pool.shutdown(wait=False, cancel_futures=True)
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.fd = -1

    # -- protocol -------------------------------------------------------------------------
    def _reply(self, unique: int, error: int = 0, payload: bytes = b"") -> None:
        data = _OUT_HEADER.pack(_OUT_HEADER.size + len(payload), -error, unique) + payload
        try:
            os.write(self.fd, data)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EBADF, errno.ENODEV):  # interrupted/gone
                raise

    def _attr(self, node: Node) -> bytes:
        mode = (stat.S_IFDIR | 0o555) if node.is_dir else (stat.S_IFREG | 0o444)
        return _ATTR.pack(
            node.ino,
            node.size,
            (node.size + 511) // 512,
            self.now,
            self.now,
            self.now,
            0,
            0,
            0,
            mode,
            2 if node.is_dir else 1,
            os.getuid(),
            os.getgid(),
            0,
            4096,
            0,
        )

    def _entry(self, node: Node) -> bytes:
        return struct.pack("<QQQQII", node.ino, 0, 3600, 3600, 0, 0) + self._attr(node)

    def _serve(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, MAX_READ + 8192)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted; EBADF: closed
            if not buf:
                return
            _, opcode, unique, nodeid, *_ = _IN_HEADER.unpack_from(buf)
            body = buf[_IN_HEADER.size :]
            try:
                if self._handle(opcode, unique, nodeid, body) is False:
                    return
            except Exception as exc:  # noqa: BLE001 - one bad request must not end the mount
                self.log(f"fuse {self.name}: request {opcode} failed: {exc}")
                if opcode not in _NO_REPLY:
                    self._reply(unique, errno.EIO)

    def _handle(self, opcode: int, unique: int, nodeid: int, body: bytes):
        node = self.nodes.get(nodeid)
        if opcode == INIT:
            _major, minor, readahead, flags = struct.unpack_from("<IIII", body)
            out = (
                struct.pack(
                    "<IIIIHHIIHHI",
                    7,
                    min(minor, 31),
                    readahead,
                    flags & 1,
                    16,
                    12,
                    MAX_READ,
                    1,
                    32,
                    0,
                    0,
                )
                + b"\0" * 28
            )
            self._reply(unique, 0, out)
        elif opcode in _NO_REPLY:
            pass
        elif opcode == DESTROY:
            self._reply(unique)
            return False
        elif node is None:
            self._reply(unique, errno.ENOENT)
        elif opcode == LOOKUP:
            child = node.children.get(body.split(b"\0", 1)[0].decode("utf-8", "surrogateescape"))
            if child is None:
                self._reply(unique, errno.ENOENT)
            else:
                self._reply(unique, 0, self._entry(self.nodes[child]))
        elif opcode == GETATTR:
            self._reply(unique, 0, struct.pack("<QII", 3600, 0, 0) + self._attr(node))
        elif opcode in (OPEN, OPENDIR):
            (flags, _) = _OPEN_IN.unpack_from(body)
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
                self._reply(unique, errno.EROFS)
            else:
                self._reply(unique, 0, struct.pack("<QII", 0, FOPEN_KEEP_CACHE, 0))
        elif opcode == READ:
            _, offset, size, _ = _READ_IN.unpack_from(body)
            self.pool.submit(self._read, unique, node, offset, size)
        elif opcode == READDIR:
            _, offset, size, _ = _READ_IN.unpack_from(body)
            self._reply(unique, 0, self._dirents(node, offset, size))
        elif opcode == STATFS:
            total = sum(n.size for n in self.nodes.values())
            self._reply(
                unique,
                0,
                struct.pack(
                    "<QQQQQIIII",
                    (total + 4095) // 4096,
                    0,
                    0,
                    len(self.nodes),
                    0,
                    4096,
                    255,
                    4096,
                    0,
                )
                + b"\0" * 24,
            )
        elif opcode in (RELEASE, RELEASEDIR, FLUSH, ACCESS):
            self._reply(unique)
        else:
            self._reply(unique, errno.ENOSYS)
        return None

    def _read(self, unique: int, node: Node, offset: int, size: int) -> None:
        try:
            data = self.read(node, offset, min(size, max(0, node.size - offset)))
            self._reply(unique, 0, data)
        except Exception as exc:  # noqa: BLE001 - becomes EIO for the reader
            self.log(f"fuse {self.name}: reading {node.name} at {offset} failed: {exc}")
            self._reply(unique, errno.EIO)

    def _dirents(self, node: Node, offset: int, size: int) -> bytes:
        entries = [(".", node.ino, True), ("..", 1, True)] + [
            (name, ino, self.nodes[ino].is_dir) for name, ino in sorted(node.children.items())
        ]
        out = b""
        for index in range(offset, len(entries)):
            name, ino, is_dir = entries[index]
            raw = name.encode("utf-8", "surrogateescape")
            rec = struct.pack("<QQII", ino, index + 1, len(raw), 4 if is_dir else 8) + raw
            rec += b"\0" * (-len(rec) % 8)
            if len(out) + len(rec) > size:
                break
            out += rec
        return out
