"""The job's private network: a bridge inside a network namespace of the job's own.

The backend starts the holder once per launch of a job, as ``holder_argv`` builds it:
util-linux ``unshare`` enters a new network namespace (and, when not root, a new user
namespace in which it is root: ``--map-root-user``) and execs an isolated Python
without site (``python -I -S``) that runs this module (stdlib only: ``os``, ``select``,
``sys``, ``time``). It creates the bridge ``br0`` there with iproute2's
``ip``, prints ``ready`` and then only watches: each instance attaches itself to the
bridge with a veth pair (shipyard.sandbox.instance), and the backend writes the
instances' agent pids to the holder's stdin (``pids 123 124``). The holder exits when
every one of those has ended, when no pids came within ``--attach-timeout`` seconds, or
when its parent dies (util-linux ``setpriv --pdeathsig``); its namespaces and the bridge
go with it. It holds no address on the job network: nothing of the host can reach an
instance through it.

Why so small: as ``python -m shipyard.sandbox.network`` (site and the environment's
``.pth`` files, argparse, subprocess, ctypes, shipyard's package and typing) the holder
took 70-95 ms of CPU per job, beside four agents starting on the same cores (issue 40).
"""

from __future__ import annotations

import os
import select
import sys
import time

BRIDGE = "br0"
VETH_PREFIX = "v"
READY = "ready"
# the holder's program: this module from its cached bytecode (a file run by path is
# compiled at every start: 3 ms here), in an isolated interpreter (``-I``: no PYTHON*
# variable, no user site, no working directory on sys.path)
HOLDER = (
    f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
    "import network; sys.exit(network.main(sys.argv[1:]))"
)
ATTACH_TIMEOUT_S = 120.0
BRIDGE_BATCH = f"link set lo up\nlink add {BRIDGE} type bridge\nlink set {BRIDGE} up\n"


def veth_name(host: str) -> str:
    """The job side of an instance's veth pair (``valgo-12``; at most 15 characters)."""
    return (VETH_PREFIX + host)[:15]


def holder_argv(parent: int, rootless: bool) -> list[str]:
    """The holder's command for the backend at ``parent`` (see the module docstring):
    ``setpriv --pdeathsig KILL -- unshare --net -- python -I -S -c HOLDER ...``.
    Where util-linux ``unshare`` is missing, the holder unshares itself (``--unshare``,
    through ctypes: 5 ms more)."""
    from shipyard.runtime.lifeline import death_signal_argv
    from shipyard.sandbox import tools

    ip = tools.find("ip")
    if ip is None:
        raise OSError("iproute2's `ip` is not installed (apt-get install iproute2)")
    holder = [sys.executable, "-I", "-S", "-c", HOLDER, "--parent", str(parent), "--ip", ip]
    unshare = tools.find("unshare")
    if unshare is None:
        return death_signal_argv([*holder, "--unshare", *(["--rootless"] if rootless else [])])
    flags = ["--user", "--map-root-user", "--net"] if rootless else ["--net"]
    return death_signal_argv([unshare, *flags, "--", *holder])


def _unshare(rootless: bool) -> None:
    """The holder's own namespaces, where no ``unshare`` command did it."""
    if __package__:
        from shipyard.sandbox import kernel
    else:  # the holder: this directory is sys.path[0]
        import kernel  # type: ignore[no-redef]

    if rootless:
        uid, gid = os.getuid(), os.getgid()
        kernel.unshare(kernel.CLONE_NEWUSER | kernel.CLONE_NEWNET)
        kernel.map_root_to(uid, gid)
    else:
        kernel.unshare(kernel.CLONE_NEWNET)


def make_bridge(ip: str) -> None:
    """``lo`` up and the bridge, in this process's network namespace (``ip -batch``,
    started with ``posix_spawn``: no ``subprocess`` import)."""
    batch_in, batch = os.pipe()
    said, out = os.pipe()
    try:
        pid = os.posix_spawn(
            ip,
            [ip, "-batch", "-"],
            {"PATH": os.defpath},
            file_actions=[
                (os.POSIX_SPAWN_DUP2, batch_in, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, out, 2),
            ],
        )
    finally:
        os.close(batch_in)
        os.close(out)
    try:
        os.write(batch, BRIDGE_BATCH.encode())
    except BrokenPipeError:  # ip gave up first: what it said follows
        pass
    finally:
        os.close(batch)
    chunks = []
    while chunk := os.read(said, 4096):
        chunks.append(chunk)
    os.close(said)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(f"ip failed: {b''.join(chunks).decode(errors='replace').strip()}")


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
                    if not instances.named:  # none: nothing to hold the network for
                        return
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


def _options(argv: list[str]) -> dict[str, str]:
    """``--parent PID --ip PATH [--attach-timeout S] [--unshare] [--rootless]`` (by
    hand: argparse, with gettext, was a fifth of the holder's start)."""
    flags = ("--unshare", "--rootless")
    valued = ("--parent", "--ip", "--attach-timeout")
    options: dict[str, str] = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        if word in flags:
            options[word] = "1"
        elif word in valued and words:
            options[word] = words.pop(0)
        else:
            raise ValueError(f"unknown or incomplete option {word!r}")
    if not options.get("--parent", "").isdigit() or "--ip" not in options:
        raise ValueError("--parent PID and --ip PATH are required")
    return options


def main(argv: list[str]) -> int:
    """The holder (see the module docstring). Its death signal was armed by ``setpriv``
    before it got here: a parent gone by then is seen as a new parent."""
    try:
        options = _options(argv)
    except ValueError as exc:
        sys.stdout.write(f"error: usage: network.py {exc}\n")
        return 2
    if os.getppid() != int(options["--parent"]):
        return 1
    try:
        if "--unshare" in options:
            _unshare("--rootless" in options)
        make_bridge(options["--ip"])
    except OSError as exc:
        sys.stdout.write(f"error: {exc}\n")
        sys.stdout.flush()
        return 1
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    watch(float(options.get("--attach-timeout", ATTACH_TIMEOUT_S)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
