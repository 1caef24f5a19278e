"""The system calls an instance's processes may not make: a filter like a container's.

Capabilities alone leave a capability-less uid 0 a few ways around the instance: it
could ``unshare`` a user namespace of its own and, root there, mount cgroup v1
hierarchies rooted at its own cgroup to raise its own ``pids.max`` and memory limit;
read root's keyring (keyrings belong to users, not to namespaces); load BPF or perf
programs where the kernel lets unprivileged users. The filter below refuses what
Docker's and runc's default profiles refuse, with ``EPERM`` (``clone3`` with
``ENOSYS``, as Docker does: glibc then falls back to ``clone``, whose flags a filter
can read), and allows everything else: a deny list, so Python, torch/gloo, TensorFlow
and Open MPI (which execs through shells) run as they did.

``ptrace`` stays allowed, as in Docker on kernels from 4.8 (where a traced process can
no longer escape the filter): debuggers and ``py-spy`` inside the job work, and the
kernel still refuses a capability-less process access to any process holding
capabilities (the agent, the instance's init). ``name_to_handle_at`` stays allowed
(Docker allows it); ``open_by_handle_at`` does not (the "shocker" escape).

Built with libseccomp (through the ``pyseccomp`` ctypes binding) once per instance, in
the agent; exported as a BPF program and handed to the launcher
(shipyard.sandbox.launch), which loads it as the last step before the job's exec, so
every descendant of the job's processes inherits it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass

# namespace flags of clone(2)/unshare(2)
CLONE_NEWTIME = 0x00000080  # unshare only: in clone's flags the low byte is a signal
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NAMESPACES = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
)
# personality(2) flags runc's profile refuses (Docker allows only a few personas): a
# readable-implies-executable or page-zero mapping weakens the kernel's own defences.
# Bit 31 must be clear in a match, so the query personality(0xffffffff) stays allowed.
PERSONALITY_UNSAFE = (0x0100000, 0x0200000, 0x0400000)  # MMAP_PAGE_ZERO, ADDR_COMPAT, RIE
QUERY_BIT = 0x80000000

MISSING_LIBRARY = (
    "no seccomp filter: libseccomp or its binding pyseccomp is not installed "
    "(apt-get install libseccomp2; pip install pyseccomp): the job's processes may "
    "unshare a user namespace, use the keyring, bpf and perf"
)
MISSING_KERNEL = (
    "no seccomp filter: this kernel has no seccomp (CONFIG_SECCOMP_FILTER): the job's "
    "processes may unshare a user namespace, use the keyring, bpf and perf"
)


@dataclass(frozen=True)
class Rule:
    """``syscall`` fails with ``error``; with ``masks``, only when argument ``arg``
    has every bit of one of them set (``value``: the bits that must equal the mask's
    within ``mask``; None: the mask itself)."""

    syscall: str
    error: int = errno.EPERM
    arg: int = 0
    masks: tuple[tuple[int, int], ...] = ()


def _flags(names: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((flag, flag) for flag in names)


DENIED_ALWAYS = (
    # namespaces: no way out of the instance's, nor into another's
    "setns",
    # the mount family: the view is the instance's, fixed
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    # keyrings belong to users, not namespaces: root's would be every root job's
    "keyctl",
    "add_key",
    "request_key",
    # the kernel itself
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "lookup_dcookie",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "iopl",
    "ioperm",
    "vm86",
    "vm86old",
    # the machine's clock
    "clock_settime",
    "settimeofday",
    "stime",
    "adjtimex",
    "clock_adjtime",
    # the "shocker" escape: open any inode of a mounted filesystem by handle
    "open_by_handle_at",
    # page-fault handling in user space: the classic way to win kernel races
    "userfaultfd",
    # io_uring's operations do not pass through this filter
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)

RULES: tuple[Rule, ...] = (
    *(Rule(name) for name in DENIED_ALWAYS),
    Rule("unshare", masks=_flags((*CLONE_NAMESPACES, CLONE_NEWTIME))),
    Rule("clone", masks=_flags(CLONE_NAMESPACES)),
    # clone3's flags are in a struct a filter cannot read: "not implemented", and glibc
    # (pthread_create, posix_spawn) falls back to clone
    Rule("clone3", error=errno.ENOSYS),
    Rule("personality", masks=tuple((flag | QUERY_BIT, flag) for flag in PERSONALITY_UNSAFE)),
)


def kernel_has_seccomp() -> bool:
    """The kernel filters system calls (``Seccomp:`` in /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return any(line.startswith("Seccomp:") for line in fh)
    except OSError:
        return False


def build() -> tuple[bytes | None, str | None]:
    """The filter as a BPF program (``struct sock_filter`` array) for this machine's
    architectures, or None and why not (the job then runs without it, said)."""
    if not kernel_has_seccomp():
        return None, MISSING_KERNEL
    try:
        import pyseccomp
    except (ImportError, OSError, AttributeError):  # no binding, or no libseccomp.so.2
        return None, MISSING_LIBRARY
    filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for arch in _compat_arches(pyseccomp):
        try:
            filt.add_arch(arch)
        except OSError:
            pass
    for rule in RULES:
        _add(pyseccomp, filt, rule)
    with tempfile.TemporaryFile() as fh:
        filt.export_bpf(fh)
        fh.seek(0)
        return fh.read(), None


def _add(pyseccomp, filt, rule: Rule) -> None:  # noqa: ANN001 - an optional module
    """One rule, on every architecture of the filter; a call this architecture lacks
    (``vm86`` on x86_64) is skipped."""
    action = pyseccomp.ERRNO(rule.error)
    try:
        if not rule.masks:
            filt.add_rule(action, rule.syscall)
            return
        for mask, value in rule.masks:
            filt.add_rule(
                action, rule.syscall, pyseccomp.Arg(rule.arg, pyseccomp.MASKED_EQ, mask, value)
            )
    except (OSError, ValueError, RuntimeError):
        pass


def _compat_arches(pyseccomp) -> list[int]:  # noqa: ANN001
    """The 32-bit ABIs of this machine, filtered by the same rules: otherwise a 32-bit
    binary (or ``int 0x80``) would be killed outright by libseccomp's default."""
    machine = os.uname().machine
    names = {"x86_64": ("X86", "X32"), "aarch64": ("ARM",)}.get(machine, ())
    return [getattr(pyseccomp.Arch, n) for n in names if hasattr(pyseccomp.Arch, n)]


def denied_syscalls() -> list[str]:
    """Every system call the filter refuses, whatever its arguments or with some."""
    return sorted({rule.syscall for rule in RULES})
