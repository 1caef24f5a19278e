"""Death signals and reaping: how a process makes sure it never outlives its parent.

Shared by the agent (which supervises an instance's processes) and by the libraries
that start processes inside an instance (shipyard.ps, ddp, tf, mpi), so none of those
has to import the agent.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_LIBC: ctypes.CDLL | None
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - non-glibc platforms
    _LIBC = None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux).

    Call it in the child itself (at its start, or through :func:`death_signal_argv`),
    not as a ``preexec_fn``: code between fork and exec is unsafe in a process with
    threads."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def arm_death_signal(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """A child's first step: die with ``parent_pid``. False when that parent is already
    gone (it died before the signal was armed: the caller should exit)."""
    die_with_parent(sig)
    return os.getppid() == parent_pid


def death_signal_argv(argv: list[str], sig: str = "KILL") -> list[str]:
    """``argv`` run under util-linux ``setpriv --pdeathsig``: the program dies with the
    process that starts it, without a preexec_fn (thread-safe). Unchanged where setpriv
    is missing (the caller's process tree stop still applies)."""
    setpriv = _setpriv()
    return [setpriv, "--pdeathsig", sig, "--", *argv] if setpriv else list(argv)


_SETPRIV: list[str | None] = []


def _setpriv() -> str | None:
    if not _SETPRIV:
        _SETPRIV.append(shutil.which("setpriv") or shutil.which("setpriv", path="/usr/bin:/bin"))
    return _SETPRIV[0]


def become_subreaper() -> None:
    """Adopt orphaned descendants (a script's daemonized helpers) so they can be reaped
    and stopped with the instance instead of escaping to init."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def parent_death_argv(argv: list[str], sig: int = signal.SIGKILL) -> list[str]:
    """``argv`` behind a tiny exec wrapper that sets the death signal in the child itself.

    The thread-safe replacement for ``preexec_fn=die_with_parent`` in a process with
    threads (preexec_fn may deadlock there: it runs Python between fork and exec). The
    wrapper checks that its parent is still the one that started it (a parent that died
    before the prctl would otherwise be missed), then execs ``argv``. The signal fires
    when the *thread* that started the child ends: start it from one that lives as long.
    """
    import os
    import sys

    return [
        sys.executable,
        "-S",
        "-c",
        _WRAPPER,
        str(os.getpid()),
        str(int(sig)),
        *argv,
    ]


_WRAPPER = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[2]), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(137)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts: it cannot be signalled,
    but it is there). For leases and launchers named by pid: a gone owner frees what it held."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
