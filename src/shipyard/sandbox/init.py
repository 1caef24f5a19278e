"""The instance's init: pid 1 of its PID namespace, and the filesystem view of its processes.

Run by path with ``python -S`` (stdlib only: no site, about 15 ms to start) as the first
child of the agent's spawner (shipyard.sandbox.pidns). It unshares a mount namespace,
mounts a ``/proc`` of the instance's PID namespace, sets up the view the job's processes
get (the ``SHIPYARD_INIT_VIEW`` JSON, built by shipyard.sandbox.fsview), prints one line
(``ready`` and a JSON list of what it could not protect, with why) and then only reaps.

The view, in the order it is built (each step on its own: one the kernel refuses is
named, the others still hold):

* ``overlay``: directories (``/etc``) that get a writable layer in memory over the host's,
  thrown away with the instance: a script writing ``/etc/...`` runs, the host is untouched;
  the files the agent bound into them (``/etc/hosts``, ``/etc/resolv.conf``) are bound
  again on top;
* ``mask``: directories (``$SHIPYARD_HOME``, ``/root``, ``/home``, ``/dev/shm``) replaced by an empty
  writable tmpfs (``~/.keras`` works and vanishes), into which only the ``keep_rw`` (the
  job's own directory) and ``keep_ro`` paths (the Python environment, local channels)
  under them are bound back: other jobs' trees and secrets, the server's store and home
  directories are not there;
* ``read_only``: the Python environment, bound read-only over itself.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 1 << 14, 1 << 18
MNT_DETACH = 2

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
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def build(view: dict) -> list[str]:
    """The view (see the module docstring); returns what could not be done, with why."""
    missing: list[str] = []
    keep = [(p, False) for p in view.get("keep_rw", [])] + [
        (p, True) for p in view.get("keep_ro", [])
    ]
    rebind = [p for p in view.get("rebind", []) if os.path.exists(p)]
    fds: dict[str, int] = {}
    for path in [p for p, _ in keep] + rebind:
        try:
            fds[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            pass
    for directory in view.get("overlay", []):
        try:
            _overlay(directory)
        except (Refused, OSError) as exc:
            missing.append(f"{directory} is the host's, writable: {exc}")
    for path in rebind:
        if path in fds:
            try:
                _mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND)
            except Refused as exc:
                missing.append(f"{path}: {exc}")
    for top in view.get("mask", []):
        if not os.path.isdir(top):
            continue
        try:
            mode = "1777" if top in view.get("sticky", []) else "0755"  # /dev/shm: everyone's
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
        except Refused as exc:
            missing.append(f"{top} is visible: {exc}")
            continue
        for path, read_only in keep:
            if _under(path, top) and path in fds:
                try:
                    _bind(fds[path], path, read_only)
                except (Refused, OSError) as exc:
                    missing.append(f"{path} is not reachable: {exc}")
    for path in view.get("read_only", []):
        if not os.path.isdir(path):
            continue
        try:
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except Refused as exc:
            missing.append(f"{path} is writable: {exc}")
    for fd in fds.values():
        os.close(fd)
    return missing


def _overlay(directory: str, scratch: str = "/tmp") -> None:
    """A writable in-memory layer over ``directory``. Its tmpfs is mounted over ``scratch``
    (in this mount namespace only: the host's is untouched) and detached once the overlay
    holds it, so nothing of it is visible anywhere else."""
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    try:
        os.mkdir(f"{scratch}/upper")
        os.mkdir(f"{scratch}/work")
        options = f"lowerdir={directory},upperdir={scratch}/upper,workdir={scratch}/work"
        _mount("overlay", directory, "overlay", MS_NOSUID | MS_NODEV, options)
    finally:
        libc.umount2(os.fsencode(scratch), MNT_DETACH)


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
