"""The instance's init: pid 1 of its PID namespace, and the filesystem view of its processes.

Run by path with ``python -S`` (stdlib only: no site, about 15 ms to start) as the first
child of the agent's spawner (shipyard.sandbox.pidns). It unshares a mount namespace,
mounts a ``/proc`` of the instance's PID namespace, sets up the view the job's processes
get (the ``SHIPYARD_INIT_VIEW`` JSON, built by shipyard.sandbox.fsview), prints one line
(``ready`` and a JSON list of what it could not protect, with why) and then only reaps.

The view, in the order it is built (each step on its own: one the kernel refuses is
named, the others still hold):

* ``root_overlay``: a new root (``pivot_root``), a tmpfs whose top-level directories are
  overlays of the host's with a writable layer in memory, thrown away with the instance
  (scripts writing ``/etc/...``, ``/usr/local/...`` or a new ``/data`` run, the host is
  untouched); the host's other mounts bound at their places; where the kernel refuses
  the new root, only the ``overlay`` directories (``/etc``, ``/usr/local``, ...) get a layer;
* ``devices``: a ``/dev`` of its own (a tmpfs with the host's ``null``, ``zero``, GPUs,
  ...; a devpts of its own): no disk of the host's;
* ``mask`` and ``private_tmp``: directories (``$SHIPYARD_HOME``, ``/root``, ``/home``,
  ``/dev/shm``, ``/tmp``) replaced by an empty writable tmpfs (``~/.keras`` works and
  vanishes), into which only the ``keep_rw`` (the job's own directory, paths its spec
  names) and ``keep_ro`` paths (the Python environment, local channels) under them are
  bound back: other jobs' trees and secrets, the server's store, home directories and
  the host's ``/tmp`` are not there;
* ``read_only``: the Python environment, bound read-only over itself;
* then every mount taken from the host (``/sys``, other disks) is made read-only, except
  the instance's own (``writable``: ``/opt/ml``, ``/etc/hosts``, its ``/dev``), and so are
  ``/proc/sys`` and ``/proc/sysrq-trigger`` (uid 0 writes sysctls by file permission).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import signal
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 1 << 14, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, 155)
OLD_ROOT = ".shipyard-old-root"
# mounts that stay writable in the instance: its own /proc (its sysctls excepted), its
# ptys (the tmpfs it was given are named in the view)
NEVER_READ_ONLY = ("proc", "devpts", "mqueue")
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger")
DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)
DEVPTS_OPTIONS = "newinstance,ptmxmode=0666,mode=0620"

libc = ctypes.CDLL(None, use_errno=True)


class Refused(Exception):
    pass


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data) if data else None):
        err = ctypes.get_errno()
        raise Refused(f"mount {source or fstype} on {target}: {os.strerror(err)}")


def _bind(fd: int, target: str, read_only: bool) -> None:
    is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if read_only:
        _read_only(target)


def _read_only(target: str) -> None:
    """Remount the mount at ``target`` read-only (this mount only, not those below it),
    keeping the flags it has: in a user namespace the kernel refuses a remount that would
    clear a flag the mount was given outside it (nosuid, nodev, noexec)."""
    kept = os.statvfs(target).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount of this namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), left.split()[4])
            out.append((point, right.split()[0]))
    return out


def _outermost(points: list[str]) -> list[str]:
    return [p for p in points if not any(q != p and _under(p, q) for q in points)]


def build(view: dict) -> list[str]:
    """The view (see the module docstring); returns what could not be done, with why."""
    missing: list[str] = []
    private = [*view.get("mask", []), *view.get("private_tmp", [])]
    writable = [*view.get("keep_rw", []), *private, *view.get("writable", [])]
    keep = sorted(
        [(p, False) for p in view.get("keep_rw", [])]
        + [(p, True) for p in view.get("keep_ro", [])],
        key=lambda item: item[0].count("/"),  # a path before the paths inside it
    )
    fds: dict[str, int] = {}
    for path, _ in keep:
        try:
            fds[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            pass
    old_root: str | None = None
    layers: list[str] = []
    if view.get("root_overlay"):
        try:
            old_root, layers = _new_root()
        except (Refused, OSError) as exc:
            missing.append(
                f"/ is the host's ({exc}): only {', '.join(view.get('overlay', []))} get a "
                "throw-away writable layer"
            )
    if old_root is None:
        for directory in view.get("overlay", []):
            try:
                _overlay(directory)
            except (Refused, OSError) as exc:
                missing.append(f"{directory} is the host's, writable: {exc}")
    if old_root is not None:
        missing += _private_dev(view.get("devices", []))
    for top in private:
        if not os.path.isdir(top):
            continue
        try:
            mode = "1777" if top in view.get("sticky", []) else "0755"  # /tmp: everyone's
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
        except Refused as exc:
            missing.append(f"{top} is visible: {exc}")
            private = [p for p in private if p != top]
    for path, read_only in keep:
        # a kept path is bound where it is otherwise not there (under a mask, in the
        # private /tmp) and, read-write, where the throw-away root would swallow writes
        hidden = any(_under(path, top) for top in private)
        if path in fds and (hidden or (old_root is not None and not read_only)):
            try:
                _bind(fds[path], path, read_only)
            except (Refused, OSError) as exc:
                missing.append(f"{path} is not reachable: {exc}")
    for path in view.get("read_only", []):
        if not os.path.isdir(path):
            continue
        try:
            _mount(path, path, None, MS_BIND | MS_REC)
            _read_only(path)
        except Refused as exc:
            missing.append(f"{path} is writable: {exc}")
    for fd in fds.values():
        os.close(fd)
    if old_root is not None:
        missing += _detach(old_root)
        missing += _host_mounts_read_only(writable, layers)
    missing += _kernel_settings_read_only()
    return missing


def _new_root(scratch: str = "/tmp") -> tuple[str, list[str]]:
    """Make this mount namespace's root a tmpfs whose every top-level directory is an
    overlay: the host's directory below, a writable layer in memory above (thrown away
    with the instance). Mounts below a directory (``/etc/hosts``, ``/opt/ml``) are bound
    again on top of its overlay; a directory that is a mount of its own (``/proc``,
    ``/sys``, ``/dev``, another disk), or one the kernel will not overlay (rootless, one
    holding mounts made outside the user namespace: the kernel will not copy those apart)
    is bound as it is, and made read-only later. Not one overlay of ``/``: rootless the
    kernel refuses that (``/`` holds such mounts). Returns where the old root now is
    (detached by the caller, once the kept paths are bound from it) and the directories
    that got a writable layer."""
    points = [p for p, _ in _mount_points() if p != "/"]
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    new = f"{scratch}/root"
    layers: list[str] = []
    try:
        os.mkdir(new)
        _mount("tmpfs", new, "tmpfs", MS_NODEV, "mode=0755")
        for name in sorted(os.listdir("/")):
            if _place(f"/{name}", new, scratch, points):
                layers.append(f"/{name}")
        os.mkdir(f"{new}/{OLD_ROOT}")
        os.chdir(new)
        if libc.syscall(SYS_PIVOT_ROOT, b".", os.fsencode(OLD_ROOT)):
            raise Refused(f"pivot_root: {os.strerror(ctypes.get_errno())}")
    except BaseException:
        os.chdir("/")
        libc.umount2(os.fsencode(scratch), MNT_DETACH)  # the host's root stays as it was
        raise
    os.chdir("/")
    return "/" + OLD_ROOT, layers


def _place(path: str, new: str, scratch: str, points: list[str]) -> bool:
    """One top-level entry of the host's root in the new root (see _new_root); True
    when it got a writable layer."""
    target = new + path
    if os.path.islink(path):
        os.symlink(os.readlink(path), target)
        return False
    if not os.path.isdir(path):
        open(target, "w").close()
        _mount(path, target, None, MS_BIND | MS_REC)
        return False
    os.mkdir(target)
    os.chmod(target, os.stat(path).st_mode & 0o7777)
    if path == scratch:  # the private /tmp goes there
        return False
    if path not in points:
        below = _outermost(list(dict.fromkeys(p for p in points if _under(p, path))))
        layer = f"{scratch}/layers{path}"
        os.makedirs(f"{layer}/upper")
        os.mkdir(f"{layer}/work")
        options = f"lowerdir={path},upperdir={layer}/upper,workdir={layer}/work"
        try:
            _mount("overlay", target, "overlay", MS_NODEV, options)
        except Refused:
            pass  # bound as it is below, read-only later
        else:
            for point in below:
                _mount_point(point, new + point)
                _mount(point, new + point, None, MS_BIND | MS_REC)
            return True
    _mount(path, target, None, MS_BIND | MS_REC)
    return False


def _mount_point(source: str, target: str) -> None:
    """Something to mount ``source`` on at ``target``: a directory or an empty file."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()


def _detach(old_root: str) -> list[str]:
    """The host's root, left below the new one by pivot_root, made unreachable."""
    if libc.umount2(os.fsencode(old_root), MNT_DETACH) == 0:
        os.rmdir(old_root)
        return []
    why = os.strerror(ctypes.get_errno())
    _mount("tmpfs", old_root, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0")  # hidden
    return [f"the host's root is covered, not detached, at {old_root}: {why}"]


def _private_dev(names: list[str]) -> list[str]:
    """A ``/dev`` of the instance's own (as a container's): a tmpfs holding only the
    host's ``names`` (glob patterns: null, zero, the GPUs, ...) bound back, a devpts of its
    own and the usual links. The host's ``/dev`` holds its disks, which uid 0 opens by file
    permission alone, no capability needed: the raw disk would be the whole host."""
    fds: dict[str, int] = {}
    for pattern in names:
        for path in glob.glob(os.path.join("/dev", pattern)):
            try:
                fds[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                pass
    try:
        _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755")
    except Refused as exc:
        for fd in fds.values():
            os.close(fd)
        return [f"/dev is the host's (its disks included): {exc}"]
    missing = []
    for path, fd in sorted(fds.items()):
        try:
            _bind(fd, path, read_only=False)
        except (Refused, OSError) as exc:
            missing.append(f"{path} is not there: {exc}")
        os.close(fd)
    for name, target in DEV_LINKS:
        os.symlink(target, f"/dev/{name}")
    for name in ("pts", "shm"):
        os.mkdir(f"/dev/{name}", 0o755)
    try:
        _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, DEVPTS_OPTIONS)
    except Refused as exc:
        missing.append(f"no terminals of its own: {exc}")
    return missing


def _host_mounts_read_only(writable: list[str], layers: list[str]) -> list[str]:
    """Every mount the new root took from the host (``/sys``, ``/dev``, other disks) made
    read-only, except the instance's own (its tree, ``/proc``, ``/dev/pts``, masks):
    the overlay root is the only place a write goes, and it goes away."""
    missing = []
    for point, fstype in _mount_points():
        if point == "/" or point in layers or fstype in NEVER_READ_ONLY:
            continue
        if not os.path.exists(point):
            continue
        if any(_under(point, top) for top in writable):
            continue
        try:
            _read_only(point)
        except (Refused, OSError) as exc:
            missing.append(f"{point} is the host's, writable: {exc}")
    return missing


def _kernel_settings_read_only() -> list[str]:
    """``/proc/sys`` and ``/proc/sysrq-trigger`` read-only (as a container's): uid 0 may
    write most sysctls by file permission alone, without any capability."""
    missing = []
    for path in PROC_READ_ONLY:
        if not os.path.exists(path):  # a kernel without magic SysRq
            continue
        try:
            _mount(path, path, None, MS_BIND)
            _read_only(path)
        except (Refused, OSError) as exc:
            missing.append(f"{path} is writable: {exc}")
    return missing


def _overlay(directory: str, scratch: str = "/tmp") -> None:
    """A writable in-memory layer over ``directory`` (the fallback where the root cannot be
    one). Its tmpfs is mounted over ``scratch`` (in this mount namespace only: the host's
    is untouched) and detached once the overlay holds it, so nothing of it is visible
    anywhere else. Mounts below ``directory`` (``/etc/hosts``) are bound again on top."""
    below = [p for p, _ in _mount_points() if p != directory and _under(p, directory)]
    fds = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in _outermost(below)}
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    try:
        os.mkdir(f"{scratch}/upper")
        os.mkdir(f"{scratch}/work")
        options = f"lowerdir={directory},upperdir={scratch}/upper,workdir={scratch}/work"
        _mount("overlay", directory, "overlay", MS_NOSUID | MS_NODEV, options)
        for point, fd in fds.items():
            _mount(f"/proc/self/fd/{fd}", point, None, MS_BIND | MS_REC)
    finally:
        libc.umount2(os.fsencode(scratch), MNT_DETACH)
        for fd in fds.values():
            os.close(fd)


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        if libc.unshare(CLONE_NEWNS):
            raise Refused(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except Refused as exc:
        sys.stdout.write(f"error: {exc}\n")
        sys.stdout.flush()
        os._exit(1)
    missing = build(json.loads(os.environ.get("SHIPYARD_INIT_VIEW") or "{}"))
    sys.stdout.write("ready " + json.dumps(missing) + "\n")
    sys.stdout.flush()
    os.close(1)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        signal.sigtimedwait([signal.SIGCHLD], 1.0)


if __name__ == "__main__":
    main()
