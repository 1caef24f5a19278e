"""The job processes' launcher compiled (``launch.c``): shipyard.sandbox.launch, step for
step, without an interpreter's start.

Every process of a sandboxed instance starts through the launcher; as ``python -I -S
launch.py`` that was 20-30 ms of CPU per process on a loaded 2-core machine (the
interpreter, ctypes, compiling the script), about a tenth of a 4-instance job's
container share; the compiled one takes about 1 ms (issue 40). It is built on the
machine that runs it, once per source version, as the bind shim is
(shipyard.sandbox.bindshim): ``cc`` writes ``<cache>/shipyard-launch-<crc>-<size>`` (a
private temporary file, then an atomic rename). Whatever lies there runs with the
agent's privileges, so it is used only when the file and its directory are this user's
and writable by nobody else (as the seccomp program's cache, shipyard.sandbox.seccomp).
Without a compiler (or with one that fails: a marker beside it says so, and no later
agent tries again for that source version) or such a directory the Python launcher runs,
as before.
"""

from __future__ import annotations

import binascii
import os
import stat

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.c")
PREFIX = "shipyard-launch-"
COMPILE_TIMEOUT_S = 120.0
_FOUND: list[str | None] = []  # per process: the launcher's path, once looked up


def path() -> str | None:
    """The compiled launcher, built now if needed; None where it cannot be."""
    if not _FOUND:
        _FOUND.append(_find_or_build())
    return _FOUND[0]


def name() -> str:
    """Its file name: the source and the machine's architecture decide the binary (a CRC,
    not hashlib's OpenSSL: the name tells versions apart, the trust is the directory's)."""
    with open(SOURCE, "rb") as fh:
        source = fh.read()
    key = binascii.crc32(source + os.uname().machine.encode())
    return f"{PREFIX}{key:08x}-{len(source)}"


def _user_cache_dir() -> str:
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "shipyard")


def trusted(candidate: str) -> bool:
    """``candidate`` is a regular executable file (not a link) that this user alone could
    have written, in a directory likewise."""
    try:
        st = os.lstat(candidate)
        parent = os.stat(os.path.dirname(candidate))
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and bool(st.st_mode & stat.S_IXUSR)
        and all(
            s.st_uid == os.geteuid() and not s.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            for s in (st, parent)
        )
    )


def _find_or_build() -> str | None:
    if not os.path.isfile(SOURCE) or os.uname().sysname != "Linux":
        return None
    binary = name()
    found = os.path.join(_user_cache_dir(), binary)
    if trusted(found):  # the usual case: nothing imported beyond this module's own
        return found
    from shipyard.sandbox import bindshim

    for directory in bindshim._cache_dirs():
        candidate = os.path.join(directory, binary)
        if trusted(candidate):
            return candidate
        if bindshim._private_dir(directory):
            # a compiler that failed once fails again: said by a marker, so that not
            # every agent of every job pays for a failing build (100-300 ms of CPU)
            failed = candidate + ".failed"
            if os.path.exists(failed):
                return None
            if _compile(candidate) and trusted(candidate):
                return candidate
            try:
                os.close(os.open(failed, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            except OSError:
                pass
            return None
    return None


def _compile(target: str) -> bool:
    """Build ``target`` atomically (a private temporary file renamed into place)."""
    import shutil
    import subprocess
    import tempfile

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return False
    fd, tmp = tempfile.mkstemp(prefix=".launch-", dir=os.path.dirname(target))
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, "-O2", "-o", tmp, SOURCE],
            capture_output=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            return False
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
        return True
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
