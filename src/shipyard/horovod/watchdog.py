"""Never a silent hang: the stall watchdog, peers' "exiting" notices and the abort of
the whole job on an uncaught exception (see engine.py's docstring).

``Watchdog`` is a mixin of ``Engine``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# Row kinds.


class Watchdog:
    def _abort(self, message: str) -> None:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        self._ctl.abort(1)

    def _peer_exit_notice(self) -> int | None:
        """The rank of a peer that announced it is exiting, if any (control communicator)."""
        if not self.thread_level_multiple or self.MPI is None:
            return None
        MPI = self.MPI
        status = MPI.Status()
        if self._ctl.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_EXIT_TAG, status=status):
            buf = np.zeros(1, np.int64)
            self._ctl.comm.Recv(buf, source=status.Get_source(), tag=_EXIT_TAG)
            return int(buf[0])
        return None

    def _watchdog(self) -> None:
        warned: set = set()
        exited: set[int] = set()
        while not self._watchdog_stop.wait(1.0):
            for ctx in {id(self._main): self._main, id(self._bg): self._bg}.values():
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


_EXIT_TAG = 7707


def _install_abort_on_uncaught(eng: Any, current: Callable[[], Any]) -> None:
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
            if current() is eng and not eng._closed:
                sys.stderr.write(
                    f"shipyard.horovod: uncaught {exc_type.__name__} on rank {eng.rank}; "
                    "aborting the job so the other ranks do not wait forever\n"
                )
                sys.stderr.flush()
                eng._ctl.abort(1)

    sys.excepthook = hook
