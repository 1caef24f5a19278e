"""An instance's processes hold no privilege: no capability, no way to gain one.

Every process the agent starts for the job (the script, MPI launchers, TF and PS
servers; their children inherit it) goes through ``launch``: one exec of the launcher
(shipyard.sandbox.launch) that enters the instance's view, empties every capability set
(bounding, inheritable, ambient, effective, permitted), sets ``no_new_privs``, loads the
seccomp filter (shipyard.sandbox.seccomp) and only then applies the job's environment,
so nothing privileged ever runs with a variable the job chose (``LD_PRELOAD``: issue
37). For root that matters most: a uid-0 process whose bounding set is empty gets no
capability back at ``execve`` (the kernel grants root's full set only within the
bounding set), and ``no_new_privs`` keeps set-uid binaries and file capabilities from
handing any back. Without ``CAP_SYS_ADMIN`` the script cannot ``setns()`` into a host
namespace (the one it would use to leave network isolation), mount or remount; without
``CAP_SYS_PTRACE``/``CAP_SYS_MODULE``/``CAP_NET_ADMIN`` it cannot trace host processes,
load modules or rewire the instance's network. The agent keeps its own capabilities (it
set the sandbox up and does the instance's data transfers); a capability-less process
cannot trace it or read its fds, since the kernel refuses ptrace access to a process
holding capabilities its caller lacks.

Measured: the Python launcher cost about 12 ms more per process than the util-linux chain
it replaced (the interpreter's start; docs/decisions.md), 20-30 ms of CPU on a loaded
machine; where a compiler is there it runs compiled (``launch.c``, shipyard.sandbox.launchbin:
about 1 ms). ``confined_argv`` (util-linux
``setpriv``, about a millisecond) stays for processes whose environment is shipyard's
own.
"""

from __future__ import annotations

import os
import sys

from shipyard.sandbox import tools

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")
PLAN = "SHIPYARD_LAUNCH"  # read by the launcher (stdlib only), carried here
ENV_PREFIX = "SHIPYARD_JOB_ENV:"  # shipyard.sandbox.launch.ENV_PREFIX

DROP_ALL = [
    "--no-new-privs",
    "--bounding-set",
    "-all",
    "--inh-caps",
    "-all",
    "--ambient-caps",
    "-all",
]
MISSING_NOTE = (
    "util-linux `setpriv` is not installed: this instance's processes keep the agent's "
    "capabilities (apt-get install util-linux)"
)


def confined_argv(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` run without any capability and with ``no_new_privs``, and a note when that
    cannot be done here (the job still runs, with the protection named as missing).

    An ``argv`` already confined is returned as it is: a runner whose process needs a
    privileged set-up step first (a mount namespace of its own, see
    tf_parameter_server.with_chief_model_dir) confines the program after that step."""
    if confined(argv):
        return list(argv), None
    setpriv = tools.find("setpriv")
    if setpriv is None:
        return list(argv), MISSING_NOTE
    return [setpriv, *DROP_ALL, "--", *argv], None


def confined(argv: list[str]) -> bool:
    """Whether ``argv`` drops every privilege somewhere along its chain of execs."""
    width = len(DROP_ALL)
    return any(argv[i : i + width] == DROP_ALL for i in range(len(argv) - width + 1))


def launcher_argv() -> list[str]:
    """The launcher: compiled (shipyard.sandbox.launchbin: about 1 ms of CPU per process,
    the interpreter's start 20-30 ms) where this machine can build it, else run by the
    agent's interpreter: isolated (``-I``: no ``PYTHON*`` variable, no user site, not the
    working directory on ``sys.path``), no site."""
    from shipyard.sandbox import launchbin

    compiled = launchbin.path()
    return [compiled] if compiled else python_launcher_argv()


def python_launcher_argv() -> list[str]:
    """The launcher as a Python script (where no compiled one can be built)."""
    return [sys.executable, "-I", "-S", LAUNCHER]


def with_binds(argv: list[str], binds: list[tuple[str, str]]) -> list[str]:
    """``argv`` launched in a mount namespace of its own where each (source, target) is
    bound: the privileged step happens in the launcher, before it drops privileges."""
    flags = [word for source, target in binds for word in ("--bind", source, target)]
    return [*launcher_argv(), *flags, "--", *argv]


def launch(
    argv: list[str],
    env: dict[str, str] | None,
    cwd: str | None,
    mount_ns: str | None,
    seccomp_bpf: bytes | None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``argv`` as a job's process: through the
    launcher, in ``mount_ns`` (None: the agent's own), in ``cwd``, without privileges,
    under the seccomp filter ``seccomp_bpf`` (None: none), with ``env`` (None: the
    agent's) applied at its exec only. The returned environment is fixed and minimal
    (``PATH``, the plan) plus the job's variables under a prefix nothing interprets."""
    prefix = launcher_argv()
    if argv[: len(prefix)] != prefix:  # not already launched with binds (with_binds)
        argv = [*prefix, "--", *argv]
    from shipyard.sandbox.launch import encode_plan

    plan = {"cwd": os.fsencode(cwd or os.getcwd())}
    if mount_ns:
        plan["mnt"] = os.fsencode(mount_ns)
    if seccomp_bpf:
        plan["seccomp"] = seccomp_bpf
    job_env = dict(os.environ) if env is None else env
    carried = {ENV_PREFIX + name: value for name, value in job_env.items()}
    return list(argv), {"PATH": os.defpath, PLAN: encode_plan(plan), **carried}
