"""The job's private network: a bridge inside a network namespace of the job's own.

``python -m shipyard.sandbox.network --parent PID [--rootless]`` is started by the
backend once per launch of a job. It enters a new network namespace (and, when not root,
a new user namespace in which it is root), creates the bridge ``br0`` there, prints
``ready`` and then only watches: each instance attaches itself to the bridge with a veth
pair (shipyard.sandbox.instance), and the backend writes the instances' agent pids to the
holder's stdin (``pids 123 124``). The holder exits when every one of those has ended,
when no pids came within ``--attach-timeout`` seconds, or when its parent dies
(PR_SET_PDEATHSIG); its namespaces and the bridge go with it. It holds no
address on the job network: nothing of the host can reach an instance through it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from shipyard.runtime.lifeline import die_with_parent
from shipyard.sandbox import kernel, tools

BRIDGE = "br0"
VETH_PREFIX = "v"
READY = "ready"


def veth_name(host: str) -> str:
    """The job side of an instance's veth pair (``valgo-12``; at most 15 characters)."""
    return (VETH_PREFIX + host)[:15]


def _setup(rootless: bool) -> None:
    if rootless:
        uid, gid = os.getuid(), os.getgid()
        kernel.unshare(kernel.CLONE_NEWUSER | kernel.CLONE_NEWNET)
        kernel.map_root_to(uid, gid)
    else:
        kernel.unshare(kernel.CLONE_NEWNET)
    ip = tools.find("ip")
    if ip is None:
        raise RuntimeError("iproute2's `ip` is not installed")
    subprocess.run(
        [ip, "-batch", "-"],
        input=(f"link set lo up\nlink add {BRIDGE} type bridge\nlink set {BRIDGE} up\n").encode(),
        check=True,
        capture_output=True,
    )


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _read_pids(pids: list[int]) -> None:
    for line in sys.stdin:
        word, _, rest = line.partition(" ")
        if word == "pids":
            pids.extend(int(p) for p in rest.split())


def watch(attach_timeout: float, poll: float = 0.1) -> None:
    """Return once the job's instances have all ended (see the module docstring)."""
    pids: list[int] = []
    threading.Thread(target=_read_pids, args=(pids,), daemon=True).start()
    started = time.monotonic()
    while True:
        if pids:
            if not any(_running(p) for p in list(pids)):
                return
        elif time.monotonic() - started > attach_timeout:
            return
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.sandbox.network")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--rootless", action="store_true")
    parser.add_argument("--attach-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    die_with_parent(signal.SIGKILL)
    if os.getppid() != args.parent:  # the parent died before the death signal was armed
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _setup(args.rootless)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        sys.stdout.write(f"error: {exc} {detail.decode(errors='replace').strip()}\n")
        sys.stdout.flush()
        return 1
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    watch(args.attach_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
