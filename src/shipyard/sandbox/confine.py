"""An instance's processes hold no privilege: no capability, no way to gain one.

Every process the agent starts for the job (the script, MPI ranks, TF and PS servers)
runs under util-linux ``setpriv`` with an empty capability bounding set, empty
inheritable and ambient sets and ``no_new_privs``. For root that matters most: a uid-0
process whose bounding set is empty gets no capability back at ``execve`` (the kernel
grants root's full set only within the bounding set), and ``no_new_privs`` keeps set-uid
binaries and file capabilities from handing any back. Without ``CAP_SYS_ADMIN`` the
script cannot ``setns()`` into a host namespace (the one it would use to leave network
isolation), mount or remount; without ``CAP_SYS_PTRACE``/``CAP_SYS_MODULE``/
``CAP_NET_ADMIN`` it cannot trace host processes, load modules or rewire the instance's
network. The agent keeps its own capabilities (it set the sandbox up and does the
instance's data transfers); a capability-less process cannot trace it or read its fds,
since the kernel refuses ptrace access to a process holding capabilities its caller lacks.

Measured: the extra ``setpriv`` exec costs about a millisecond per process.
"""

from __future__ import annotations

from shipyard.sandbox import tools

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
