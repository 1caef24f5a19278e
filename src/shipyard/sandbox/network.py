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
import select
import signal
import subprocess
import sys
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


FALLBACK_POLL_S = 0.1  # pids without a pidfd (kernels before 5.3): looked at this often


class _Instances:
    """The agents the holder serves: each watched through a pidfd (readable once the
    process has ended, zombie or not), or by polling where the kernel has none."""

    def __init__(self, poller: select.poll) -> None:
        self.poller = poller
        self.pidfds: set[int] = set()
        self.polled: list[int] = []
        self.named = False  # any pid given yet

    def add(self, pid: int) -> None:
        self.named = True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            return
        except (OSError, AttributeError):  # no pidfd here
            self.polled.append(pid)
            return
        self.pidfds.add(fd)
        self.poller.register(fd, select.POLLIN)

    def ended(self, fd: int) -> bool:
        """``fd`` was one of the pidfds (now closed)."""
        if fd not in self.pidfds:
            return False
        self.poller.unregister(fd)
        self.pidfds.discard(fd)
        os.close(fd)
        return True

    def all_ended(self) -> bool:
        self.polled = [p for p in self.polled if _running(p)]
        return self.named and not self.pidfds and not self.polled


def watch(attach_timeout: float, stdin: int = 0) -> None:
    """Return once the job's instances have all ended (see the module docstring): a
    wait on their pidfds and on ``stdin`` (``pids 123 124`` lines), with no sleep in
    between, so the holder ends, and the backend's wait for it with it, as soon as the
    last agent has (a poll every 0.1 s had added 50 ms on average to every launch)."""
    poller = select.poll()
    poller.register(stdin, select.POLLIN)
    instances = _Instances(poller)
    deadline = time.monotonic() + attach_timeout
    pending = b""
    try:
        while not instances.all_ended():
            if instances.named:
                timeout_ms = int(FALLBACK_POLL_S * 1000) if instances.polled else None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                timeout_ms = max(1, int(left * 1000))
            for fd, _ in poller.poll(timeout_ms):
                if instances.ended(fd):
                    continue
                chunk = os.read(stdin, 4096)
                if not chunk:  # the backend closed its end: the pids known are all
                    poller.unregister(stdin)
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    word, _, rest = line.decode(errors="replace").partition(" ")
                    if word == "pids":
                        for pid in rest.split():
                            if pid.isdigit():
                                instances.add(int(pid))
    finally:
        for fd in list(instances.pidfds):
            instances.ended(fd)


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
