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

Built with libseccomp (through the ``pyseccomp`` ctypes binding) once per machine and
version of this module: the BPF program is kept in the user's private cache
(``<cache>/seccomp-<CRC of this file and the machine>-<size>.bpf``, the bind shim's cache
directory, shipyard.sandbox.bindshim) and read from there by every later agent.
Importing the binding cost each agent 20-60 ms on a loaded 2-core machine (two
``ldconfig -p`` runs of ``ctypes.util.find_library``), four times at once for a
4-instance job; reading the cached program costs well under a millisecond
(docs/decisions.md). The agent hands the program to the launcher
(shipyard.sandbox.launch), which loads it as the last step before the job's exec, so
every descendant of the job's processes inherits it.
"""

from __future__ import annotations

import binascii
import errno
import os
import stat
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
    architectures, or None and why not (the job then runs without it, said): the
    cached program when there is one (see the module docstring), else compiled and
    cached."""
    if not kernel_has_seccomp():
        return None, MISSING_KERNEL
    name = cache_name()
    cached = _read_cached(os.path.join(_user_cache_dir(), name))
    if cached is not None:  # nothing imported beyond this module's own imports
        return cached, None
    for directory in _cache_dirs():
        cached = _read_cached(os.path.join(directory, name))
        if cached is not None:
            return cached, None
    bpf, why = compile_filter()
    if bpf is not None:
        _store(bpf, name)
    return bpf, why


# struct sock_filter is 8 bytes; the kernel takes at most BPF_MAXINSNS (4096) of them
INSN_SIZE = 8
MAX_PROGRAM = 4096 * INSN_SIZE


def cache_name() -> str:
    """The cached program's file name: this module's source (the rules and how they
    are added) and the machine's architecture decide the program. A CRC, not a
    cryptographic hash (``hashlib`` loads OpenSSL: 3-6 ms per agent): the name only
    tells versions of this file apart; the file's trust comes from where it lies
    (``_read_cached``)."""
    with open(__file__, "rb") as fh:
        source = fh.read()
    key = binascii.crc32(source + os.uname().machine.encode())
    return f"seccomp-{key:08x}-{len(source)}.bpf"


def _user_cache_dir() -> str:
    """``bindshim._cache_dirs()[0]`` without importing the bind shim (pathlib, hashlib:
    10-15 ms of an agent's start): where the program is found but on a first run."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "shipyard")


def _cache_dirs() -> list[str]:
    from shipyard.sandbox import bindshim

    return bindshim._cache_dirs()


def _read_cached(path: str) -> bytes | None:
    """The program at ``path`` when it is a plausible one this user alone could have
    written (a regular file, ours, writable by nobody else, in a directory likewise),
    else None: whatever lies there is loaded into every job's processes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        parent = os.stat(os.path.dirname(path))
        trusted = all(
            s.st_uid == os.geteuid() and not s.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            for s in (st, parent)
        )
        if not trusted or not stat.S_ISREG(st.st_mode):
            return None
        if not 0 < st.st_size <= MAX_PROGRAM or st.st_size % INSN_SIZE:
            return None
        data = os.read(fd, st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == st.st_size else None


def _store(bpf: bytes, name: str) -> None:
    """Keep the program for later agents: a private temporary file renamed into place
    (concurrent agents of one job each write a whole, identical file); a cache that
    cannot be written only costs the next agent a compile."""
    import tempfile

    from shipyard.sandbox import bindshim

    for directory in _cache_dirs():
        if not bindshim._private_dir(directory):
            continue
        try:
            fd, tmp = tempfile.mkstemp(prefix=".seccomp-", suffix=".bpf", dir=directory)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(bpf)
            os.chmod(tmp, 0o600)
            os.replace(tmp, os.path.join(directory, name))
            return
        except OSError:
            try:
                os.remove(tmp)
            except OSError:
                pass


def compile_filter() -> tuple[bytes | None, str | None]:
    """The filter compiled by libseccomp now (``build`` without the cache)."""
    try:
        import pyseccomp
    except (ImportError, OSError, AttributeError):  # no binding, or no libseccomp.so.2
        return None, MISSING_LIBRARY
    import tempfile

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
