"""Ranks that disagree get a clear error on every rank, never a hang; a rank that stalls is
reported by the watchdog and, when asked, the job is aborted."""

from __future__ import annotations

import pytest

MISMATCH = r"""
import numpy as np
import shipyard.horovod as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
odd = r == n - 1   # only the last rank differs


def expect(fn, exc, *fragments):
    try:
        fn()
    except exc as e:
        msg = str(e)
        for f in fragments:
            assert f in msg, (fn.__name__, f, msg)
        print(f"ERR {r} {fn.__name__}", flush=True)
    else:
        raise AssertionError(f"{fn.__name__}: no error on rank {r}")
    # the engine is still usable and in step on every rank
    assert hvd.allreduce(np.ones(2), op=hvd.Sum).tolist() == [n, n]


def shape():
    hvd.allreduce(np.zeros((3, 5 if odd else 4), np.float32), name="w")


def dtype():
    hvd.allreduce(np.zeros(3, np.float64 if odd else np.float32), name="d")


def name():
    hvd.allreduce(np.zeros(3), name="b" if odd else "a")


def op():
    hvd.allreduce(np.zeros(2), op=hvd.Max if odd else hvd.Sum)


def root():
    hvd.broadcast(np.zeros(2), root_rank=1 if odd else 0)


def gather():
    hvd.allgather(np.zeros((2, 3 if odd else 2)))


def kind():
    if odd:
        hvd.broadcast(np.zeros(2), 0)
    else:
        hvd.allreduce(np.zeros(2))


def splits():
    hvd.alltoall(np.zeros(n), splits=([n + 1] + [0] * (n - 1)) if odd else [1] * n)


def grouped():
    hvd.grouped_allreduce([np.zeros(3), np.zeros(4 if odd else 3)])


def async_op():
    hvd.synchronize(hvd.allreduce_async(np.zeros(4 + odd), name="g"))


expect(shape, hvd.TensorMismatchError, "rank 0: allreduce tensor 'w' dtype float32 shape (3, 4)",
       f"rank {n - 1}: allreduce tensor 'w' dtype float32 shape (3, 5)", "same order")
expect(dtype, hvd.TensorMismatchError, "dtype float32", "dtype float64")
expect(name, hvd.TensorMismatchError, "tensor 'a'", "tensor 'b'")
expect(op, hvd.TensorMismatchError, "op=Sum", "op=Max")
expect(root, hvd.TensorMismatchError, "root=0", "root=1")
expect(gather, hvd.TensorMismatchError, "allgather", "shape (2,)", "shape (3,)")
expect(kind, hvd.TensorMismatchError, f"rank {n - 1}: broadcast", "rank 0: allreduce")
expect(splits, hvd.CollectiveArgumentError, f"rank {n - 1}: error: splits")
expect(grouped, hvd.TensorMismatchError, "shapes [(3,), (3,)]", "shapes [(3,), (4,)]")
expect(async_op, hvd.TensorMismatchError, "tensor 'g'", "shape (4,)", "shape (5,)")
assert isinstance(hvd.TensorMismatchError("x"), hvd.HorovodInternalError)
print(f"OK {r}", flush=True)
"""

CASES = ["shape", "dtype", "name", "op", "root", "gather", "kind", "splits", "grouped", "async_op"]


@pytest.mark.parametrize("np_", [2, 4])
def test_mismatches_raise_on_every_rank(run_mpi, np_):
    res = run_mpi(MISMATCH, np_, timeout=60)
    assert res.returncode == 0, f"stdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
    for case in CASES:
        ranks = sorted(int(ln.split()[1]) for ln in res.lines("ERR ") if ln.split()[2] == case)
        assert ranks == list(range(np_)), (case, res.stdout)
    assert len(res.lines("OK ")) == np_


STALL = r"""
import time
import numpy as np
import shipyard.horovod as hvd

hvd.init()
if hvd.rank() == 0:
    hvd.allreduce(np.ones(3), name="stuck_here")
else:
    time.sleep(60)  # e.g. a data loader that never returns
"""


def test_stalled_rank_is_reported_and_job_aborted(run_mpi):
    res = run_mpi(
        STALL,
        2,
        env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"},
        timeout=40,
    )
    assert res.returncode != 0  # run_mpi's timeout (40 s) is the hang guard
    assert "rank 0 has waited" in res.stderr and "'stuck_here'" in res.stderr
    assert "aborting the job" in res.stderr


CRASH = r"""
import numpy as np
import shipyard.horovod as hvd

hvd.init()
if hvd.rank() == 1:
    raise RuntimeError("boom on rank 1")
hvd.allreduce(np.ones(3), name="never_completes")
"""


def test_uncaught_exception_on_one_rank_aborts_the_job(run_mpi):
    res = run_mpi(CRASH, 2, timeout=40)
    assert res.returncode != 0  # run_mpi's timeout (40 s) is the hang guard
    assert "RuntimeError: boom on rank 1" in res.stderr
    assert "uncaught RuntimeError on rank 1; aborting the job" in res.stderr


EARLY_EXIT = r"""
import sys
import numpy as np
import shipyard.horovod as hvd

hvd.init()
hvd.allreduce(np.ones(3))
if hvd.rank() == 0:
    sys.exit(0)  # one fewer collective than the others: without help, MPI hangs here forever
hvd.allreduce(np.ones(3), name="last")
"""


def test_rank_leaving_early_does_not_hang_the_others(run_mpi):
    res = run_mpi(EARLY_EXIT, 2, env={"SHIPYARD_HOROVOD_EXIT_GRACE_SECONDS": "1"}, timeout=40)
    assert res.returncode != 0  # run_mpi's timeout (40 s) is the hang guard
    assert "rank 1 has waited" in res.stderr and "'last'" in res.stderr
    assert "rank(s) [0] already finished and exited" in res.stderr
