"""The one step between the agent and a job's process: confine, then exec the job.

Run by path with ``python -I -S`` (stdlib only, no site, no ``PYTHON*`` variable
honoured) as ``launch.py [--bind SRC DST]... -- PROGRAM ARGS...``, in a fixed, minimal
environment of its own: ``PATH``, ``SHIPYARD_PROCESS_NAME``, the plan
(``SHIPYARD_LAUNCH``, built by shipyard.sandbox.confine, see ``decode_plan``) and the job's variables,
each carried under its name behind ``SHIPYARD_JOB_ENV:`` where no loader, libc or
interpreter looks. A job's ``LD_PRELOAD`` (or ``PYTHONPATH``, ``GCONV_PATH``, ...)
therefore reaches nothing that holds a privilege: it takes effect at the last exec,
after every privilege is gone.

In this one process, in this order:

1. join the instance's mount namespace (the view its init built; ``plan["mnt"]``) and
   change to ``plan["cwd"]`` inside it (after entering: a directory opened before
   would lead back out of the view);
2. for each ``--bind``: a mount namespace of its own (a copy of the view) with SRC
   bound at DST (a TF ps task sees the chief's model dir at ``/opt/ml/model``);
3. drop every capability (bounding, inheritable, ambient, effective, permitted) and
   set ``no_new_privs``: set-uid binaries and file capabilities give none back;
4. load the seccomp filter (``plan["seccomp"]``, a BPF program built by
   shipyard.sandbox.seccomp): inherited by every descendant;
5. ``execvpe`` the program with the job's environment (its ``PATH`` finds it).

One exec instead of util-linux ``nsenter`` + coreutils ``env`` + ``setpriv`` per
process, each of which ran with the job's environment and every capability.
Exit status 125 when a step fails (as ``env`` does), 127 when the program is missing.
"""

from __future__ import annotations

import ctypes
import os
import sys

PLAN = "SHIPYARD_LAUNCH"
ENV_PREFIX = "SHIPYARD_JOB_ENV:"
PROCESS_NAME = "SHIPYARD_PROCESS_NAME"
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 1 << 14, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 24, 38, 22
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def enter(mount_ns: str | None, cwd: str, binds: list[tuple[str, str]]) -> None:
    """Steps 1 and 2 of the module docstring."""
    if mount_ns:
        try:
            fd = os.open(mount_ns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:  # the instance's init is gone: the instance is ending
            raise OSError(exc.errno, f"cannot open {mount_ns}: {exc.strerror}") from None
        try:
            _check(libc.setns(fd, CLONE_NEWNS), f"setns {mount_ns}")
        finally:
            os.close(fd)
    if binds:
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        for source, target in binds:
            os.makedirs(source, exist_ok=True)  # a peer's tree may not be built yet
            os.makedirs(target, exist_ok=True)
            _check(
                libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND, None),
                f"mount --bind {source} {target}",
            )
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot change directory to {cwd}: {exc.strerror}") from None


def drop_privileges() -> None:
    """Step 3: no capability now, none at any later exec, ``no_new_privs``."""
    last = 63
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
            last = int(fh.read())
    except (OSError, ValueError):
        pass
    # a user other than root holding no capability has none to drop and gets none at
    # exec (no_new_privs keeps file capabilities out): the kernel's EPERM is no failure
    powerless = os.getuid() != 0 and _permitted() == 0
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == 22 or (powerless and ctypes.get_errno() == 1):
                continue  # EINVAL: a capability this kernel does not have
            _check(-1, f"prctl(PR_CAPBSET_DROP, {cap})")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before 4.3
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset (drop all)")


def _permitted() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("CapPrm:"):
                return int(line.split()[1], 16)
    return 0


def load_filter(bpf: bytes) -> None:
    """Step 4 (``no_new_privs`` is set: no privilege needed)."""
    buffer = ctypes.create_string_buffer(bpf, len(bpf))
    program = _SockFprog(len(bpf) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(
        libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )


def parse(args: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(binds, program argv) from ``[--bind SRC DST]... -- PROGRAM ARGS...``."""
    binds = []
    while args and args[0] == "--bind" and len(args) >= 3:
        binds.append((args[1], args[2]))
        args = args[3:]
    if not args or args[0] != "--" or len(args) < 2:
        raise ValueError("usage: launch.py [--bind SRC DST]... -- PROGRAM [ARGS...]")
    return binds, args[1:]


def job_environment(environ: dict[str, str]) -> dict[str, str]:
    """The job's variables, as they were before they were carried here."""
    env = {k[len(ENV_PREFIX) :]: v for k, v in environ.items() if k.startswith(ENV_PREFIX)}
    if PROCESS_NAME in environ:  # set by the supervisor on every process it starts
        env[PROCESS_NAME] = environ[PROCESS_NAME]
    return env


def decode_plan(text: str) -> dict[str, bytes]:
    """The plan: ``key=hex;key=hex`` (each value's bytes in hex: any path, the BPF
    program, no quoting, and no ``json``/``re`` import, which cost the launcher 6 ms of
    start-up). Keys: ``mnt``, ``cwd`` (paths), ``seccomp`` (a BPF program)."""
    plan = {}
    for item in text.split(";"):
        key, _, value = item.partition("=")
        if key:
            plan[key] = bytes.fromhex(value)
    return plan


def encode_plan(plan: dict[str, bytes]) -> str:
    """``decode_plan``'s inverse (used by shipyard.sandbox.confine)."""
    return ";".join(f"{key}={value.hex()}" for key, value in plan.items())


def main() -> None:
    try:
        plan = decode_plan(os.environ.get(PLAN) or "")
        binds, argv = parse(sys.argv[1:])
        # no plan: started by hand or outside the agent; the environment is its own
        env = job_environment(dict(os.environ)) if PLAN in os.environ else dict(os.environ)
        mnt = plan.get("mnt")
        enter(os.fsdecode(mnt) if mnt else None, os.fsdecode(plan.get("cwd") or b"/"), binds)
        drop_privileges()
        if plan.get("seccomp"):
            try:
                load_filter(plan["seccomp"])
            except OSError as exc:  # checked by the agent; said if the kernel still refuses
                sys.stderr.write(f"shipyard: no seccomp filter for {argv[0]}: {exc.strerror}\n")
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc
        sys.stderr.write(f"shipyard: cannot start the job's process: {why}\n")
        os._exit(125)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stderr.write(f"shipyard: cannot run {argv[0]}: {exc.strerror}\n")
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
