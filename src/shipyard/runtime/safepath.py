"""Paths the host opens in a tree a job can write, resolved without following links.

An instance's tree (``/opt/ml``, ``<job>/instances/algo-k`` on the host) is written by the
job's processes; the agent and the supervisor read and write it as root in the host's
filesystem. A plain ``open(path)`` there follows any symlink the job planted: the failure
text went into a host ``.pth`` file, a log read returned a root-only host file (runc's
symlink CVEs are the same story). Every host-side access to such a tree goes through this
module: a trusted ``root`` (the job's directory, ``/opt/ml``) and a path below it whose
every component is opened without following a link:

* ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` (Linux 5.6+),
  one syscall through ctypes: the kernel refuses a link anywhere below ``root`` (ELOOP) and
  any escape from it (EXDEV);
* where the kernel or a seccomp filter refuses openat2 (ENOSYS, EPERM), each component is
  opened with ``O_NOFOLLOW`` relative to its parent's descriptor: the same guarantee, one
  ``open`` per component.

Mount points below ``root`` are crossed (a FastFile channel is a FUSE mount in the tree).
Stdlib only: the agent, the supervisor and the runtime libraries all stand on it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
SYS_OPENAT2 = 437  # the same number on every architecture (added after the table merge)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None
_openat2_ok: bool | None = None  # None: not tried yet; False: fall back for good


def _syscall() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return _libc


def relative(root: str, path: str) -> str:
    """``path`` (absolute, or relative to ``root``) as a path below ``root``; a path
    outside it, or one with a ``..`` component, is refused (ValueError): host code names
    the files it means, it never walks up."""
    rel = os.path.relpath(path, root) if os.path.isabs(path) else path
    parts = [p for p in rel.split(os.sep) if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"{path!r} is not a path below {root!r}")
    return os.sep.join(parts)


def _openat2(dirfd: int, rel: str, flags: int, mode: int) -> int | None:
    """The fd, or None where openat2 is unavailable (then the caller falls back)."""
    global _openat2_ok
    libc = _syscall()
    if _openat2_ok is False or libc is None:
        return None
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
    fd = libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(rel)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd >= 0:
        _openat2_ok = True
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and _openat2_ok is None:
        _openat2_ok = False  # an old kernel, or a filter refusing it: components from now on
        return None
    if err == errno.EAGAIN:  # a rename raced the lookup: the component walk is exact
        return None
    raise OSError(err, f"{os.strerror(err)} (a link, or a path leaving the tree)", rel)


def _walk_open(dirfd: int, rel: str, flags: int, mode: int) -> int:
    """openat2's guarantee by hand: every component opened with O_NOFOLLOW relative to its
    parent's descriptor."""
    parts = rel.split(os.sep)
    fd = os.dup(dirfd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        os.close(fd)


def open_beneath(root: str, path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """An fd for ``path`` below ``root``, no component of it followed if it is a link
    (OSError ELOOP/EXDEV then). ``root`` itself is trusted: the caller's own directory."""
    rel = relative(root, path)
    rootfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _openat2(rootfd, rel, flags, mode)
        return fd if fd is not None else _walk_open(rootfd, rel, flags, mode)
    finally:
        os.close(rootfd)


def read_bytes(root: str, path: str, limit: int | None = None, tail: bool = False) -> bytes:
    """A regular file's content (at most ``limit`` bytes: its first, or with ``tail`` its
    last). A link, a FIFO or a device is refused (OSError), never opened for reading."""
    fd = open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if tail and limit is not None and st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks = []
        left = limit if limit is not None else -1
        while left != 0:
            chunk = os.read(fd, 1 << 16 if left < 0 else min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left = left - len(chunk) if left > 0 else left
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(root: str, path: str, limit: int | None = None, tail: bool = False) -> str:
    """``read_bytes`` decoded (UTF-8, undecodable bytes replaced)."""
    return read_bytes(root, path, limit, tail).decode("utf-8", "replace")


def write_text(root: str, path: str, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` atomically with ``text``: a fresh temporary file created O_EXCL
    beside it (whatever stood at that name, a planted link included, is removed first, not
    followed), then renamed over the name (a link there is replaced, not written through)."""
    rel = relative(root, path)
    parent, name = os.path.split(rel)
    dirfd = open_beneath(root, parent, _DIR_FLAGS) if parent else _root_fd(root)
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except FileNotFoundError:
            pass
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode,
            dir_fd=dirfd,
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as fh:
                fh.write(text)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except OSError:
            pass
        raise
    finally:
        os.close(dirfd)


def append_bytes(root: str, path: str, data: bytes, mode: int = 0o600) -> None:
    """Append to a regular file below ``root`` (created if missing), never through a link."""
    fd = open_beneath(root, path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.write(fd, data)
    finally:
        os.close(fd)


def lstat(root: str, path: str) -> os.stat_result | None:
    """The entry at ``path`` itself (a link is reported as a link), or None when absent;
    its directories are resolved without following links."""
    rel = relative(root, path)
    parent, name = os.path.split(rel)
    try:
        dirfd = open_beneath(root, parent, _DIR_FLAGS) if parent else _root_fd(root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(dirfd)


def exists(root: str, path: str) -> bool:
    """Whether an entry (of any kind, a link included) is at ``path``."""
    try:
        return lstat(root, path) is not None
    except OSError:
        return True  # something is there that is not followed: it exists


def _root_fd(root: str) -> int:
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


@dataclass(frozen=True)
class Entry:
    """One entry of a tree being sent (``walk``): ``rel`` is ``/``-separated."""

    rel: str
    kind: str  # "file", "dir" (an empty one: nothing below it to stand for it), "link"
    size: int
    mtime_ns: int
    mode: int = 0o644  # permission bits
    target: str = ""  # a link's target, as written


def walk(root: str, path: str) -> Iterator[Entry]:
    """Every regular file and empty directory below ``path`` (sorted, depth first), each
    directory opened without following a link. A link is yielded as a link, never entered
    or read through; FIFOs, sockets and devices are left out. ``path`` missing, or itself a
    link: nothing."""
    try:
        fd = open_beneath(root, path, _DIR_FLAGS) if relative_or_none(root, path) else None
    except OSError:
        return
    if fd is None:
        fd = _root_fd(root)
    try:
        yield from _walk_fd(fd, "")
    finally:
        os.close(fd)


def relative_or_none(root: str, path: str) -> str | None:
    """``relative``, or None when ``path`` is ``root`` itself."""
    if os.path.normpath(os.path.join(root, path)) == os.path.normpath(root):
        return None
    return relative(root, path)


def _walk_fd(dirfd: int, prefix: str) -> Iterator[Entry]:
    names = sorted(os.listdir(dirfd))
    for name in names:
        rel = f"{prefix}{name}"
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=dirfd)
            except OSError:
                target = ""
            yield Entry(rel, "link", 0, st.st_mtime_ns, 0o777, target)
        elif stat.S_ISREG(st.st_mode):
            yield Entry(rel, "file", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
        elif stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
            except OSError:  # replaced by a link meanwhile: not entered
                continue
            try:
                before = len(rel)
                empty = True
                for entry in _walk_fd(sub, rel + "/"):
                    empty = False
                    yield entry
                if empty:
                    yield Entry(rel[:before], "dir", 0, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
            finally:
                os.close(sub)


def link_leaves(rel: str, target: str) -> bool:
    """Whether a link at ``rel`` (below a tree's top) names something outside the tree: an
    absolute target, or one whose ``..`` climbs above the top."""
    if os.path.isabs(target):
        return True
    depth = rel.count("/")  # directories between the top and the link
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def open_file(root: str, path: str) -> int:
    """An fd to read a regular file below ``root`` (``read_bytes``' checks), for a copy or
    an upload that streams it: what is sent is what was checked, whatever the name points
    at by then."""
    fd = open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def open_record(path: str, mode: str = "rb", encoding: str | None = None) -> IO[Any]:
    """A job record of the host's (a log, utilization.jsonl), opened without following a
    link at its name. The records live outside every instance's view; this keeps a link
    put there by anyone from turning a root reader or appender onto another file.
    ``mode``: "rb", "r", "a" or "ab"."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    if mode.startswith("a"):
        flags |= os.O_WRONLY | os.O_APPEND | os.O_CREAT
    elif mode.startswith("r"):
        flags |= os.O_RDONLY
    else:
        raise ValueError(f"open_record: mode {mode!r} is not one of r, rb, a, ab")
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None)
