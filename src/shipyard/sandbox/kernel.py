"""The few namespace system calls Python 3.11 lacks (unshare, setns, mount, sethostname).

Called through ctypes in the process that needs them: no helper exec, so entering a
sandbox costs microseconds, not a process start.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int = 0) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data) if data else None),
        f"mount {source or fstype} on {target}",
    )


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def map_root_to(uid: int, gid: int, pid: str = "self") -> None:
    """In a new user namespace: be root inside it, ``uid``/``gid`` outside (as
    ``unshare --map-root-user`` does)."""
    with open(f"/proc/{pid}/setgroups", "w") as fh:
        fh.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as fh:
        fh.write(f"0 {uid} 1")
    with open(f"/proc/{pid}/gid_map", "w") as fh:
        fh.write(f"0 {gid} 1")
