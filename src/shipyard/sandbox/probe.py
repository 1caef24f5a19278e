"""What this machine supports: can instances run in sandboxes here, and if not, why.

Read by the control plane when it plans a job (``decide``) and by ``shipyard doctor``.
The trial is real: a forked child unshares the namespaces an instance needs (and a user
namespace when not root) and reports the kernel's answer. The result is cached per
process; SHIPYARD_SANDBOX=off turns the sandbox off.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from functools import lru_cache

from shipyard import settings
from shipyard.sandbox import kernel, tools

OFF_VALUES = ("off", "0", "false", "no")


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str  # why not (empty when ok)
    rootless: bool = False
    fix: str = ""  # the command or setting that would make it work


def _trial(rootless: bool, network: bool = True) -> int:
    """0 when a forked child could unshare the namespaces, else the errno it got."""
    flags = kernel.CLONE_NEWNS | kernel.CLONE_NEWUTS
    if network:
        flags |= kernel.CLONE_NEWNET
    if rootless:
        flags |= kernel.CLONE_NEWUSER
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only makes syscalls and exits
        code = 0
        try:
            kernel.unshare(flags)
        except OSError as exc:
            code = exc.errno or 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@lru_cache(maxsize=2)
def _detect(network: bool = True) -> Support:
    if not sys.platform.startswith("linux"):
        return Support(False, f"Linux namespaces do not exist on {sys.platform}")
    if network and tools.find("ip") is None:
        return Support(False, "iproute2's `ip` is not installed", fix="apt-get install iproute2")
    if not os.path.isdir("/opt") or not os.path.exists("/etc/hosts"):
        return Support(False, "this machine has no /opt or no /etc/hosts to map")
    rootless = os.geteuid() != 0
    code = _trial(rootless, network)
    if code == 0:
        return Support(True, "", rootless=rootless)
    what = "unprivileged user namespaces" if rootless else "namespaces"
    fix = (
        "sysctl -w kernel.unprivileged_userns_clone=1 (or user.max_user_namespaces > 0)"
        if rootless
        else "run outside a container that forbids unshare(2), or with CAP_SYS_ADMIN"
    )
    return Support(
        False,
        f"the kernel refused {what}: {errno.errorcode.get(code, code)}",
        rootless=rootless,
        fix=fix,
    )


def switched_off() -> bool:
    return settings.text("SHIPYARD_SANDBOX").strip().lower() in OFF_VALUES


def support(network: bool = True) -> Support:
    """Whether instances can run sandboxed here; ``network=False``: the mount and UTS
    namespaces only (the Ray backend's sandbox, decided on each node)."""
    if switched_off():
        return Support(False, "SHIPYARD_SANDBOX=off", fix="unset SHIPYARD_SANDBOX")
    return _detect(network)


def isolation_gaps() -> list[tuple[str, str]]:
    """Which of an instance's protections (issues 31, 37) this machine cannot give, each
    with the command that fixes it: its own PID namespace and /proc, its own IPC
    namespace (the kernel), the seccomp filter (the kernel, libseccomp and pyseccomp),
    the throw-away /etc layer (overlayfs). Capabilities are dropped by shipyard's own
    launcher, which needs nothing installed. Empty when every protection holds; jobs
    run either way."""
    from shipyard.sandbox import seccomp

    gaps: list[tuple[str, str]] = []
    _, no_filter = seccomp.build()
    if no_filter is not None:
        fix = (
            "a kernel with CONFIG_SECCOMP_FILTER"
            if no_filter == seccomp.MISSING_KERNEL
            else "apt-get install libseccomp2 && pip install pyseccomp"
        )
        gaps.append((no_filter, fix))
    if sys.platform.startswith("linux"):
        rootless = os.geteuid() != 0
        user = kernel.CLONE_NEWUSER if rootless else 0
        code = _trial_flags(kernel.CLONE_NEWPID | kernel.CLONE_NEWNS | user)
        if code:
            gaps.append(
                (
                    f"the kernel refused a PID namespace ({errno.errorcode.get(code, code)}): "
                    "instances see this machine's processes",
                    "sysctl -w user.max_pid_namespaces=10000",
                )
            )
        code = _trial_flags(kernel.CLONE_NEWIPC | user)
        if code:
            gaps.append(
                (
                    f"the kernel refused an IPC namespace ({errno.errorcode.get(code, code)}): "
                    "instances share this machine's System V shared memory and queues",
                    "sysctl -w user.max_ipc_namespaces=10000",
                )
            )
    try:
        with open("/proc/filesystems", encoding="ascii") as fh:
            overlay = any(line.split()[-1:] == ["overlay"] for line in fh)
    except OSError:
        overlay = False
    if not overlay:
        gaps.append(
            (
                "no overlayfs: an instance's system directories are read-only, not a "
                "throw-away writable layer (a script writing /etc or /usr/local fails)",
                "modprobe overlay",
            )
        )
    return gaps


def _trial_flags(flags: int) -> int:
    """0 when a forked child could unshare ``flags``, else the errno it got."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only makes a syscall and exits
        code = 0
        try:
            kernel.unshare(flags)
        except OSError as exc:
            code = exc.errno or 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
