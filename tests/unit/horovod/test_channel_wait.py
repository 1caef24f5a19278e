"""A rank that waits in a negotiation for a slower rank does not busy-poll its core: the
main channel tests a nonblocking Iallgather (flat out first, then with short sleeps)
where a blocking Allgather spun for the whole wait (5.0 s of CPU in a 5 s wait, measured
in a 2-rank job; on a shared machine it took the core from the rank it waited for)."""

from __future__ import annotations

import numpy as np

from shipyard.horovod import channel as channel_mod
from shipyard.horovod.channel import MPIChannel


class _Request:
    def __init__(self, tests_until_done: int, on_done) -> None:
        self.left = tests_until_done
        self.on_done = on_done

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.left -= 1
        if self.left <= 0:
            self.on_done()
            return True
        return False


class _Comm:
    """Two ranks; the peer's row arrives after ``tests`` tests of the request."""

    def __init__(self, tests: int) -> None:
        self.tests = tests
        self.blocking = 0

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 2

    def Iallgather(self, row, table):  # noqa: N802
        def arrive() -> None:
            table[0] = row
            table[1] = row + 1

        return _Request(self.tests, arrive)

    def Allgather(self, row, table):  # noqa: N802
        self.blocking += 1
        table[0] = row
        table[1] = row + 1


class _MPI:
    SUM = MIN = MAX = PROD = LOR = LAND = object()


def _meta(polite: bool, tests: int, monkeypatch) -> tuple[np.ndarray, _Comm, list[float]]:
    sleeps: list[float] = []
    monkeypatch.setattr(channel_mod.time, "sleep", sleeps.append)
    comm = _Comm(tests)
    ch = MPIChannel(comm, _MPI, polite=polite)
    row = np.arange(channel_mod.META_WIDTH, dtype=np.int64)
    return ch.allgather_meta(row).copy(), comm, sleeps


def test_the_main_channel_waits_for_a_slow_rank_by_testing_and_sleeping(monkeypatch):
    table, comm, sleeps = _meta(polite=False, tests=5_000, monkeypatch=monkeypatch)
    assert comm.blocking == 0  # no blocking Allgather: it busy-polls for the whole wait
    assert table[1][0] == 1 and table[0][0] == 0  # the rows arrived
    # flat out first (a short wait stays fast), then a short sleep between tests
    assert len(sleeps) == 5_000 - 1 - MPIChannel._URGENT_SPINS
    assert set(sleeps) == {MPIChannel._URGENT_SLEEP}


def test_a_short_wait_does_not_sleep(monkeypatch):
    _, comm, sleeps = _meta(polite=False, tests=50, monkeypatch=monkeypatch)
    assert comm.blocking == 0 and sleeps == []
