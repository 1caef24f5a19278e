"""Real mpirun, 2 and 4 ranks: every collective checked exactly against numpy references,
the topology the runner's per-rank variables describe, the timeline file, join()."""

from __future__ import annotations

import json

import pytest

COLLECTIVES = r"""
import json, os
import numpy as np
import shipyard.horovod as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
DTYPES = [np.float32, np.float64, np.int32, np.int64]
SHAPES = [(), (7,), (3, 5), (2, 3, 4)]
checks = 0


def data(rank, dt, shape, salt):
    # small integers: every float reference below is exact, whatever order MPI sums in
    return np.random.default_rng(1000 * rank + salt).integers(-9, 10, size=shape).astype(dt)


def same(out, ref, dt, shape=None):
    global checks
    assert out.dtype == np.dtype(dt), (out.dtype, dt)
    if shape is not None:
        assert out.shape == shape, (out.shape, shape)
    assert np.array_equal(out, np.asarray(ref).astype(dt)), (out, ref)
    checks += 1


for di, dt in enumerate(DTYPES):
    for si, shape in enumerate(SHAPES):
        salt = 10 * di + si
        xs = [data(k, dt, shape, salt) for k in range(n)]
        st = np.stack(xs)
        mine = xs[r]
        same(hvd.allreduce(mine, op=hvd.Sum, name=f"s{salt}"), st.sum(0), dt, shape)
        same(hvd.allreduce(mine, op=hvd.Min), st.min(0), dt, shape)
        same(hvd.allreduce(mine, op=hvd.Max), st.max(0), dt, shape)
        same(hvd.allreduce(mine, op=hvd.Product), st.prod(0), dt, shape)
        avg = st.sum(0) / n if np.dtype(dt).kind == "f" else np.floor_divide(st.sum(0), n)
        same(hvd.allreduce(mine), avg, dt, shape)
        same(hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2, postscale_factor=3), st.sum(0) * 6, dt, shape)
        y = mine.copy()
        assert hvd.allreduce_(y, op=hvd.Sum) is y
        same(y, st.sum(0), dt, shape)
        for root in range(n):
            same(hvd.broadcast(mine, root), xs[root], dt, shape)
        # allgather: rank k contributes k+1 rows
        rest = shape[1:] if shape else ()
        parts = [data(k, dt, (k + 1,) + rest, salt + 100) for k in range(n)]
        same(hvd.allgather(parts[r]), np.concatenate(parts), dt)
        # alltoall, equal splits: 2 rows to every rank
        rows = [data(k, dt, (2 * n,) + rest, salt + 200) for k in range(n)]
        same(hvd.alltoall(rows[r]), np.concatenate([rows[k][2 * r:2 * r + 2] for k in range(n)]), dt)
        # alltoall with explicit, uneven splits
        splits = [[(k + j) % 3 for j in range(n)] for k in range(n)]
        srcs = [data(k, dt, (sum(splits[k]),) + rest, salt + 300) for k in range(n)]
        out, recv = hvd.alltoall(srcs[r], splits=splits[r])
        offs = [np.cumsum([0] + splits[k]) for k in range(n)]
        ref = np.concatenate([srcs[k][offs[k][r]:offs[k][r + 1]] for k in range(n)])
        same(out, ref, dt)
        assert recv.tolist() == [splits[k][r] for k in range(n)]

# grouped (fused) and async, mixed dtypes
xs = [[data(k, dt, (5, 3), 500 + i) for i, dt in enumerate(DTYPES * 3)] for k in range(n)]
outs = hvd.grouped_allreduce(xs[r], op=hvd.Sum)
for i, dt in enumerate(DTYPES * 3):
    same(outs[i], sum(xs[k][i].astype(np.int64) for k in range(n)), dt, (5, 3))
mine = [a.copy() for a in xs[r]]
hvd.grouped_allreduce_(mine, op=hvd.Max)
for i, dt in enumerate(DTYPES * 3):
    same(mine[i], np.max([xs[k][i] for k in range(n)], axis=0), dt)
handles = [hvd.allreduce_async(xs[r][i], op=hvd.Sum, name=f"async{i}") for i in range(4)]
handles.append(hvd.allgather_async(np.full((r + 1, 2), r, np.int32)))
handles.append(hvd.broadcast_async(np.full(3, r, np.float64), n - 1))
for i in range(4):
    same(hvd.synchronize(handles[i]), sum(xs[k][i].astype(np.int64) for k in range(n)), DTYPES[i])
same(hvd.synchronize(handles[4]), np.concatenate([np.full((k + 1, 2), k) for k in range(n)]), np.int32)
same(hvd.synchronize(handles[5]), np.full(3, n - 1), np.float64)

# random floats: close, not exact
g = np.random.default_rng(r).normal(size=(1000,)).astype(np.float32)
ref = sum(np.random.default_rng(k).normal(size=(1000,)).astype(np.float64) for k in range(n))
assert np.allclose(hvd.allreduce(g, op=hvd.Sum), ref, rtol=1e-5, atol=1e-5)
# a buffer above the fusion threshold: reduced in place, unfused
big = [np.full(3000, k + 1, np.float32) for k in range(n)]
small = [np.full(10, k + 1, np.float32) for k in range(n)]
o = hvd.grouped_allreduce([big[r], small[r]], op=hvd.Sum)
assert (o[0] == n * (n + 1) / 2).all() and (o[1] == n * (n + 1) / 2).all()

# Adasum: the same pairwise tree as the reference implementation, on every rank
from shipyard.horovod.adasum import adasum_combine
vecs = [np.random.default_rng(50 + k).normal(size=64) for k in range(n)]
assert np.allclose(hvd.allreduce(vecs[r], op=hvd.Adasum), adasum_combine(vecs))

assert hvd.broadcast_object({"from": r, "list": [r]}, root_rank=n - 1) == {"from": n - 1, "list": [n - 1]}
assert hvd.allgather_object(("rank", r)) == [("rank", k) for k in range(n)]
hvd.barrier()

# join: the last rank runs out of data first; the others keep reducing with it contributing zeros
if r == n - 1:
    last = hvd.join()
else:
    s = hvd.allreduce(np.full(4, r + 1, np.float64), op=hvd.Sum)
    assert (s == sum(range(1, n))).all(), s
    h = hvd.allreduce_async(np.ones(2), op=hvd.Sum)
    assert (hvd.synchronize(h) == n - 1).all()
    # every kind of collective still works while a rank has joined (it contributes nothing)
    assert hvd.allreduce(np.full(2, r + 1.0), op=hvd.Min).tolist() == [1.0, 1.0]
    assert hvd.allreduce(np.full(2, r + 1.0), op=hvd.Max).tolist() == [n - 1.0] * 2
    g = hvd.allgather(np.full((r + 1, 2), r))
    assert g.tolist() == [[k, k] for k in range(n - 1) for _ in range(k + 1)]
    assert hvd.broadcast(np.full(3, r), 0).tolist() == [0, 0, 0]
    out, recv = hvd.alltoall(np.arange(n) + 10 * r, splits=[1] * n)
    assert out.tolist() == [10 * k + r for k in range(n - 1)] and recv.tolist() == [1] * (n - 1) + [0]
    assert hvd.broadcast_object(("x", r), 0) == ("x", 0)
    assert hvd.allgather_object(r)[: n - 1] == list(range(n - 1))
    hvd.barrier()
    try:
        hvd.broadcast(np.zeros(1), n - 1)
    except hvd.JoinedRankError:
        pass
    else:
        raise AssertionError("broadcast from a joined root must fail")
    last = hvd.join()
# one of the ranks that kept working joined last, and every rank agrees which
assert last in range(n - 1), last
assert hvd.allgather_object(last) == [last] * n
assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == n  # all active again after join

topo = [hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]
expect = json.loads(os.environ.get("EXPECT_TOPO", "null"))
if expect is not None:
    assert topo == expect[r], (topo, expect[r])
assert hvd.mpi_enabled() and hvd.mpi_threads_supported()
print(f"OK {r} {checks} {topo}", flush=True)
"""


def _assert_ok(res, n):
    assert res.returncode == 0, (
        f"rc={res.returncode}\nstdout:\n{res.stdout[-4000:]}\nstderr:\n{res.stderr[-4000:]}"
    )
    oks = res.lines("OK ")
    assert sorted(int(ln.split()[1]) for ln in oks) == list(range(n)), res.stdout
    assert all(int(ln.split()[2]) >= 200 for ln in oks)


def test_collectives_two_ranks_with_timeline(run_mpi, tmp_path):
    trace = tmp_path / "trace" / "timeline.json"
    res = run_mpi(COLLECTIVES, 2, env={"HOROVOD_TIMELINE": str(trace)})
    _assert_ok(res, 2)
    events = json.loads(trace.read_text())  # the merged trace, valid JSON
    xs = [e for e in events if e.get("ph") == "X"]
    assert {e["pid"] for e in xs} == {0, 1}
    reduce_ops = [e for e in xs if e["name"] == "ALLREDUCE" and e["args"].get("tensor") == "s0"]
    assert len(reduce_ops) == 2 and all(
        e["args"]["bytes"] == 4 and e["dur"] >= 0 for e in reduce_ops
    )
    assert {e["name"] for e in xs} >= {
        "NEGOTIATE_ALLREDUCE",
        "ALLGATHER",
        "BROADCAST",
        "ALLTOALL",
        "MEMCPY_IN_FUSION_BUFFER",
    }
    assert any(e["tid"] == 1 for e in xs)  # async ops ran on the comm thread
    for rank in (0, 1):  # the per-rank streams are complete traces too
        json.loads((trace.parent / f"timeline.rank{rank}.json").read_text())


def test_collectives_four_ranks_on_two_instances(run_mpi):
    # 4 ranks on 2 cores; the runner's per-rank variables say algo-1 and algo-2 hold 2 ranks each
    expect = [[0, 2, 0, 2], [1, 2, 0, 2], [0, 2, 1, 2], [1, 2, 1, 2]]
    res = run_mpi(
        COLLECTIVES,
        4,
        env={"EXPECT_TOPO": json.dumps(expect), "HOROVOD_FUSION_THRESHOLD": "4096"},
        per_rank_hosts=["algo-1", "algo-2"],
        timeout=90,
    )
    _assert_ok(res, 4)


@pytest.mark.parametrize("np_", [2])
def test_topology_without_runner_env_comes_from_open_mpi(run_mpi, np_):
    res = run_mpi(
        """
        import shipyard.horovod as hvd
        hvd.init()
        print("T", hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(), flush=True)
    """,
        np_,
    )
    assert res.returncode == 0, res.stderr
    rows = sorted(tuple(map(int, ln.split()[1:])) for ln in res.lines("T "))
    assert rows == [(0, 0, 2, 0, 1), (1, 1, 2, 0, 1)]
