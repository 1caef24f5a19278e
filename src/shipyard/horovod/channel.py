"""Channels: the transport seam under the engine.

A channel is one communicator on which collectives are issued in one program order on
every rank. The engine holds two: ``main`` (used by the calling thread for synchronous
ops) and ``bg`` (used only by the background communication thread for async ops and the
torch optimizer's gradient buckets). Each is an ``MPI_Comm_dup`` of the world, so the two
threads can run collectives concurrently under MPI_THREAD_MULTIPLE without their
operations ever being matched against each other.

Implementations: ``MPIChannel`` (mpi4py, numpy buffers, in place where MPI allows) and
``SelfChannel`` (one process, no MPI: every collective is the identity). All buffers are
1-D C-contiguous numpy arrays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .ops import Average, Max, Min, Product, Sum

META_WIDTH = 8


def _is_bool(buf: np.ndarray) -> bool:
    return buf.dtype == np.bool_


class SelfChannel:
    """Size-1 channel: used when the script was not started by mpirun (or mpi4py is
    missing and only one process runs)."""

    kind = "self"

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1
        self._table = np.zeros((1, META_WIDTH), np.int64)

    def allgather_meta(self, row: np.ndarray) -> np.ndarray:
        self._table[0] = row
        return self._table

    def allreduce_(self, buf: np.ndarray, op: int) -> None:
        return None

    def allreduce_into(self, send: np.ndarray, recv: np.ndarray, op: int) -> None:
        recv[...] = send

    def allgather_rows(self, send: np.ndarray, counts: Sequence[int], recv: np.ndarray) -> None:
        recv[...] = send

    def bcast_(self, buf: np.ndarray, root: int) -> None:
        return None

    def alltoall_ints(self, send: np.ndarray) -> np.ndarray:
        return send.copy()

    def alltoallv(self, send: np.ndarray, scounts, recv: np.ndarray, rcounts) -> None:
        recv[...] = send

    def allgather_obj(self, obj: Any) -> list:
        return [obj]

    def bcast_obj(self, obj: Any, root: int) -> Any:
        return obj

    def gather_obj(self, obj: Any, root: int = 0) -> list | None:
        return [obj]

    def allgather_buf(self, send: np.ndarray, recv: np.ndarray) -> None:
        recv[0] = send

    def abort(self, code: int = 1) -> None:
        import os

        os._exit(code)


def _always() -> bool:
    return True


class MPIChannel:
    """Collectives on one communicator.

    ``polite`` (the background communication thread's channel): the data collectives run
    as nonblocking MPI calls completed by a test loop instead of a blocking call. A blocking
    MPI call busy-polls its core while it waits for slower ranks; on the comm thread that
    wait overlaps the rank's own backward pass, so with one core per rank (the usual CPU
    setting, and any shared machine) the spinning thread would take the core from the
    computation it is meant to overlap with. So the loop sleeps between tests while the
    caller computes (backing off to 200 us), and once ``urgent()`` says the caller waits for
    the result it tests flat out for a while (MPI moves a large message forward only inside
    a test, fragment by fragment), then every 20 us: a peer that is late by more than that
    (descheduled on a shared machine) must not find its core taken by our spinning.
    """

    kind = "mpi"
    _SPINS = 20  # tests before the first sleep (short waits stay fast)
    _MAX_SLEEP = 0.0002  # seconds; the backoff doubles up to this
    _URGENT_SPINS = 500  # flat-out tests (~0.2-0.5 ms) while the caller waits, then ...
    _URGENT_SLEEP = 0.00002  # ... a short sleep between tests

    def __init__(
        self, comm, MPI, polite: bool = False, urgent: Callable[[], bool] | None = None
    ) -> None:
        self.comm = comm
        self.MPI = MPI
        self.polite = polite
        self.urgent = urgent or (lambda: False)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._table = np.zeros((self.size, META_WIDTH), np.int64)
        self._ops = {Sum: MPI.SUM, Average: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}
        self._bool_ops = {
            Sum: MPI.LOR,
            Average: MPI.LOR,
            Max: MPI.LOR,
            Min: MPI.LAND,
            Product: MPI.LAND,
        }

    def _complete(self, request, waited_for: bool = False) -> None:
        """Test ``request`` until done, as the class says; ``waited_for``: the caller
        waits for it (urgent from the first test)."""
        spins = 0
        delay = 0.00002
        urgent = _always if waited_for else self.urgent
        while not request.Test():
            spins += 1
            if urgent():
                if spins > self._URGENT_SPINS:
                    time.sleep(self._URGENT_SLEEP)
                continue
            if spins > self._SPINS:
                time.sleep(delay)
                delay = min(delay * 2, self._MAX_SLEEP)

    def allgather_meta(self, row: np.ndarray) -> np.ndarray:
        """Every rank's fixed-width int64 metadata row. The returned table is reused by the
        next call: read it before issuing another collective on this channel."""
        # On every channel the rows are awaited by testing, not a blocking Allgather: a
        # negotiation is where a rank waits for a slower one (still importing its
        # framework, or a step behind), and a blocking MPI call busy-polls its core for the
        # whole wait: measured, one rank of a 2-rank job burned 5.0 s of CPU in a 5 s wait,
        # taking the core from the very rank it waited for on a shared machine. Testing
        # flat out first keeps a short wait as fast (MPIChannel's urgent mode).
        self._complete(self.comm.Iallgather(row, self._table), waited_for=not self.polite)
        return self._table

    def allreduce_(self, buf: np.ndarray, op: int) -> None:
        mpi_op = (self._bool_ops if _is_bool(buf) else self._ops)[op]
        if self.polite:
            self._complete(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=mpi_op))
        else:
            self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=mpi_op)

    def allreduce_into(self, send: np.ndarray, recv: np.ndarray, op: int) -> None:
        mpi_op = (self._bool_ops if _is_bool(send) else self._ops)[op]
        if self.polite:
            self._complete(self.comm.Iallreduce(send, recv, op=mpi_op))
        else:
            self.comm.Allreduce(send, recv, op=mpi_op)

    def allgather_rows(self, send: np.ndarray, counts: Sequence[int], recv: np.ndarray) -> None:
        """Allgatherv of flat buffers; ``counts`` in elements per rank."""
        displs = np.zeros(len(counts), dtype=np.int64)
        if len(counts) > 1:
            np.cumsum(counts[:-1], out=displs[1:])
        self.comm.Allgatherv(send, [recv, (list(map(int, counts)), list(map(int, displs)))])

    def bcast_(self, buf: np.ndarray, root: int) -> None:
        if self.polite:
            self._complete(self.comm.Ibcast(buf, root=root))
        else:
            self.comm.Bcast(buf, root=root)

    def alltoall_ints(self, send: np.ndarray) -> np.ndarray:
        recv = np.empty_like(send)
        self.comm.Alltoall(send, recv)
        return recv

    def alltoallv(self, send: np.ndarray, scounts, recv: np.ndarray, rcounts) -> None:
        sd = np.zeros(len(scounts), np.int64)
        rd = np.zeros(len(rcounts), np.int64)
        if len(scounts) > 1:
            np.cumsum(scounts[:-1], out=sd[1:])
            np.cumsum(rcounts[:-1], out=rd[1:])
        self.comm.Alltoallv(
            [send, (list(map(int, scounts)), list(map(int, sd)))],
            [recv, (list(map(int, rcounts)), list(map(int, rd)))],
        )

    def allgather_obj(self, obj: Any) -> list:
        return self.comm.allgather(obj)

    def bcast_obj(self, obj: Any, root: int) -> Any:
        return self.comm.bcast(obj, root=root)

    def gather_obj(self, obj: Any, root: int = 0) -> list | None:
        return self.comm.gather(obj, root=root)

    def allgather_buf(self, send: np.ndarray, recv: np.ndarray) -> None:
        self.comm.Allgather(send, recv)

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)
