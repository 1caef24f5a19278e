"""Never a silent hang: the stall watchdog, peers' "exiting" notices and the abort of
the whole job on an uncaught exception (see engine.py's docstring).

``Watchdog`` is given what it watches (the channel contexts, the control channel, the
limits) when the engine builds it; it holds no engine. The uncaught-exception hook gets
the process-wide engine as a callable (engine.py imports this module, not the reverse).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .channel import MPIChannel, SelfChannel
from .handles import _Ctx

_EXIT_TAG = 7707


def stall_limits(env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """Horovod's stall check: (warn after, abort after) seconds in one collective; 0 = never.
    HOROVOD_STALL_CHECK_TIME_SECONDS (60), HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (0),
    HOROVOD_STALL_CHECK_DISABLE."""
    env = os.environ if env is None else env
    check = float(env.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "60") or 0)
    shutdown = float(env.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0") or 0)
    if env.get("HOROVOD_STALL_CHECK_DISABLE", "").lower() in ("1", "true", "yes"):
        check = 0
    return check, shutdown


class Watchdog:
    """A daemon thread that looks, once a second, at what each channel context waits in."""

    def __init__(
        self,
        *,
        rank: int,
        contexts: Sequence[_Ctx],
        ctl: MPIChannel | SelfChannel,
        mpi: Any,
        probe_ok: bool,
        exit_grace: float,
        stall_check: float,
        stall_shutdown: float,
    ) -> None:
        """``probe_ok``: the MPI library allows this thread in MPI beside the others
        (MPI_THREAD_MULTIPLE); without it peers' exit notices are not read."""
        self.rank = rank
        self._contexts = list({id(c): c for c in contexts}.values())
        self._ctl = ctl
        self._mpi = mpi
        self._probe_ok = probe_ok
        self._exit_grace = exit_grace
        self._stall_check = stall_check
        self._stall_shutdown = stall_shutdown
        self._stop = threading.Event()
        self._exit_reqs: list[Any] = []
        self._exit_notice: np.ndarray | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="shipyard-hvd-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def announce_exit(self, size: int) -> None:
        """Tell every peer this rank is leaving (nonblocking sends on the control channel):
        a peer stuck in a collective this rank will never join then aborts the job."""
        if not isinstance(self._ctl, MPIChannel):
            return
        notice = np.array([self.rank], np.int64)
        comm = self._ctl.comm
        self._exit_reqs = [
            comm.Isend(notice, dest=r, tag=_EXIT_TAG) for r in range(size) if r != self.rank
        ]
        self._exit_notice = notice  # keep the buffer alive until MPI_Finalize

    def _abort(self, message: str) -> None:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        self._ctl.abort(1)

    def _peer_exit_notice(self) -> int | None:
        """The rank of a peer that announced it is exiting, if any (control communicator)."""
        if not self._probe_ok or self._mpi is None or not isinstance(self._ctl, MPIChannel):
            return None
        MPI = self._mpi
        status = MPI.Status()
        if self._ctl.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_EXIT_TAG, status=status):
            buf = np.zeros(1, np.int64)
            self._ctl.comm.Recv(buf, source=status.Get_source(), tag=_EXIT_TAG)
            return int(buf[0])
        return None

    def _run(self) -> None:
        warned: set[tuple[int, float]] = set()
        exited: set[int] = set()
        while not self._stop.wait(1.0):
            for ctx in self._contexts:
                cur = ctx.inflight
                if cur is None:
                    continue
                kind, name, t0 = cur
                what = kind if not name else f"{kind} {name!r}"
                waited = time.monotonic() - t0
                key = (id(ctx), t0)
                where = "caller" if ctx.tid == 0 else "comm thread"
                if self._exit_grace > 0 and waited > self._exit_grace:
                    peer = self._peer_exit_notice()
                    while peer is not None:
                        exited.add(peer)
                        peer = self._peer_exit_notice()
                    if exited:
                        self._abort(
                            f"shipyard.horovod: rank {self.rank} has waited {waited:.0f} s in {what} ({where}) but "
                            f"rank(s) {sorted(exited)} already finished and exited: they ran fewer collectives than "
                            "this rank (uneven data without hvd.join(), or a rank-dependent branch); aborting the job"
                        )
                if kind == "join":  # a joined rank legitimately waits for the others to finish
                    continue
                if self._stall_check > 0 and waited > self._stall_check and key not in warned:
                    warned.add(key)
                    sys.stderr.write(
                        f"shipyard.horovod: rank {self.rank} has waited {waited:.0f} s in {what} ({where}); some "
                        "rank has not submitted the same collective (a rank skipped a call, is stuck elsewhere, or "
                        "calls collectives in another order)\n"
                    )
                    sys.stderr.flush()
                if self._stall_shutdown > 0 and waited > self._stall_shutdown:
                    self._abort(
                        f"shipyard.horovod: rank {self.rank} aborting the job after {waited:.0f} s stalled in {what} "
                        "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)"
                    )


if TYPE_CHECKING:  # typing.Protocol is 3.8+; this module runs in Python 3.7 environments too
    from typing import Protocol

    class _Abortable(Protocol):
        """What the uncaught-exception hook needs of an engine."""

        rank: int

        @property
        def closed(self) -> bool: ...

        def abort_job(self) -> None: ...


def _install_abort_on_uncaught(eng: _Abortable, current: Callable[[], object]) -> None:
    """An uncaught exception on one rank aborts the whole job (after printing the traceback),
    as ``python -m mpi4py`` does: otherwise the other ranks wait in collectives forever and
    this one waits for them in MPI_Finalize. SHIPYARD_HOROVOD_ABORT_ON_ERROR=0 turns it off.
    ``current`` returns the process-wide engine (it lives in engine.py, which imports this
    module: passed in, not imported back, so the two modules form no cycle)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)
        finally:
            if current() is eng and not eng.closed:
                sys.stderr.write(
                    f"shipyard.horovod: uncaught {exc_type.__name__} on rank {eng.rank}; "
                    "aborting the job so the other ranks do not wait forever\n"
                )
                sys.stderr.flush()
                eng.abort_job()

    sys.excepthook = hook
