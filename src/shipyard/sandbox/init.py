"""The instance's init: pid 1 of its PID namespace, and the filesystem view of its processes.

Run by path with ``python -S`` (stdlib only: no site, about 15 ms to start) as the first
child of the agent's spawner (shipyard.sandbox.pidns). It unshares a mount namespace,
mounts a ``/proc`` of the instance's PID namespace, sets up the view the job's processes
get (``SHIPYARD_INIT_VIEW``, built by shipyard.sandbox.fsview, in
``viewbuild.encode_view``'s form; the mounting is shipyard.sandbox.viewbuild), prints one
line (``ready`` and what it could not protect, with why, in the same form) and then only
reaps. This script is kept small: Python compiles a script run by path at every start,
while ``viewbuild`` comes from its cached bytecode; and it imports no ``enum``.
"""

from __future__ import annotations

import os
import sys

try:  # the C module: the ``signal`` wrapper only adds enums (and imports enum for them)
    import _signal as signal
except ImportError:  # pragma: no cover - another interpreter
    import signal

if __package__:  # imported as shipyard.sandbox.init
    from shipyard.sandbox import viewbuild
else:  # run by path: this directory is sys.path[0]
    import viewbuild  # type: ignore[no-redef]


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        if viewbuild.libc.unshare(viewbuild.CLONE_NEWNS):
            errno = viewbuild.ctypes.get_errno()
            raise viewbuild.Refused(f"unshare(CLONE_NEWNS): {os.strerror(errno)}")
        viewbuild._mount(None, "/", None, viewbuild.MS_REC | viewbuild.MS_PRIVATE)
        flags = viewbuild.MS_NOSUID | viewbuild.MS_NODEV | viewbuild.MS_NOEXEC
        viewbuild._mount("proc", "/proc", "proc", flags)
    except viewbuild.Refused as exc:
        sys.stdout.write(f"error: {exc}\n")
        sys.stdout.flush()
        os._exit(1)
    missing = viewbuild.build(viewbuild.decode_view(os.environ.get("SHIPYARD_INIT_VIEW") or ""))
    sys.stdout.write("ready " + viewbuild.encode_view({"missing": missing}) + "\n")
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
