"""Pure parts of shipyard.horovod: topology, fusion planning, Adasum, launcher argv, timeline."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from shipyard.errors import ShipyardError
from shipyard.horovod import adasum, fusion, timeline, topology
from shipyard.horovod.topology import RankFacts, derive_topology
from shipyard.mpi import command as mpi_command


# ---------------------------------------------------------------- topology
def _all(facts):
    return [derive_topology(r, facts) for r in range(len(facts))]


def test_topology_prefers_runner_env_over_everything():
    # Two instances algo-1/algo-2 on ONE machine: the hostname is the same for all ranks and
    # mpirun (one node) says local size 4; the runner's HOROVOD_* variables must win.
    facts = [
        RankFacts(
            host=f"algo-{1 + r // 2}",
            local_rank=r % 2,
            local_size=2,
            cross_rank=r // 2,
            cross_size=2,
            ompi_local_rank=r,
            ompi_local_size=4,
        )
        for r in range(4)
    ]
    topo = _all(facts)
    assert [(t.local_rank, t.local_size, t.cross_rank, t.cross_size) for t in topo] == [
        (0, 2, 0, 2),
        (1, 2, 0, 2),
        (0, 2, 1, 2),
        (1, 2, 1, 2),
    ]
    assert {t.source for t in topo} == {"horovod-env"}
    assert topo[3].hostname == "algo-2"


def test_topology_from_ompi_env_derives_cross_from_local_rank():
    facts = [RankFacts(host="m", ompi_local_rank=r % 2, ompi_local_size=2) for r in range(4)]
    topo = _all(facts)
    assert [(t.local_rank, t.local_size, t.cross_rank, t.cross_size) for t in topo] == [
        (0, 2, 0, 2),
        (1, 2, 0, 2),
        (0, 2, 1, 2),
        (1, 2, 1, 2),
    ]
    assert topo[0].source == "ompi-env"


def test_topology_groups_by_host_when_no_env():
    facts = [RankFacts(host=h) for h in ["algo-1", "algo-2", "algo-1", "algo-2", "algo-2"]]
    topo = _all(facts)
    assert [(t.local_rank, t.local_size) for t in topo] == [(0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    # cross = ranks sharing my local_rank: local 0 -> ranks 0,1; local 1 -> 2,3; local 2 -> 4
    assert [(t.cross_rank, t.cross_size) for t in topo] == [(0, 2), (1, 2), (0, 2), (1, 2), (0, 1)]
    assert topo[0].source == "hosts"


def test_topology_partial_env_is_ignored_not_mixed():
    facts = [RankFacts(host="a", local_rank=0, local_size=2), RankFacts(host="a")]
    topo = _all(facts)
    assert [(t.local_rank, t.local_size) for t in topo] == [(0, 2), (1, 2)]
    assert topo[0].source == "hosts"


def test_local_facts_reads_env():
    f = topology.local_facts(
        {
            "HOROVOD_HOSTNAME": "algo-3",
            "HOROVOD_LOCAL_RANK": "1",
            "HOROVOD_LOCAL_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "x",
        }
    )
    assert (f.host, f.local_rank, f.local_size, f.cross_rank, f.ompi_local_rank) == (
        "algo-3",
        1,
        2,
        None,
        None,
    )


# ---------------------------------------------------------------- fusion
def test_plan_batches_respects_threshold_and_order():
    assert fusion.plan_batches([10, 10, 10, 10], 25) == [[0, 1], [2, 3]]
    assert fusion.plan_batches([10, 100, 10], 25) == [[0], [1], [2]]  # big one alone, in place
    assert fusion.plan_batches([5, 5, 5], 0) == [[0], [1], [2]]  # fusion off
    assert fusion.plan_batches([4, 4, 4, 4, 4], 100, first_cap=8) == [[0, 1], [2, 3, 4]]
    assert fusion.plan_batches([], 10) == []


def test_fusion_threshold_env():
    assert fusion.fusion_threshold({}) == 64 * 1024 * 1024
    assert fusion.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "1048576"}) == 1048576
    assert fusion.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "0"}) == 0
    with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD"):
        fusion.fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "lots"})


# ---------------------------------------------------------------- adasum
def test_adasum_orthogonal_is_sum_and_parallel_is_average():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    np.testing.assert_allclose(adasum.adasum_combine([a, b]), a + b)
    np.testing.assert_allclose(adasum.adasum_combine([a, a]), a)


def test_adasum_matches_formula_per_segment_and_tree():
    rng = np.random.default_rng(0)
    vs = [rng.normal(size=6) for _ in range(4)]

    def pair(x, y):
        d = x @ y
        return (1 - d / (2 * (x @ x))) * x + (1 - d / (2 * (y @ y))) * y

    def seg_pair(x, y):
        return np.concatenate([pair(x[:2], y[:2]), pair(x[2:], y[2:])])

    expect = seg_pair(seg_pair(vs[0], vs[1]), seg_pair(vs[2], vs[3]))
    np.testing.assert_allclose(adasum.adasum_combine(vs, [(0, 2), (2, 6)]), expect)


# ---------------------------------------------------------------- launcher
def test_find_mpirun_honours_override(tmp_path):
    fake = tmp_path / "my-mpirun"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert mpi_command.find_mpirun({"SHIPYARD_MPIRUN": str(fake)}) == str(fake)
    with pytest.raises(mpi_command.MPIRunNotFoundError, match="SHIPYARD_MPIRUN"):
        mpi_command.find_mpirun({"SHIPYARD_MPIRUN": str(tmp_path / "missing")})
    assert issubclass(mpi_command.MPIRunNotFoundError, FileNotFoundError)
    assert issubclass(mpi_command.MPIRunNotFoundError, ShipyardError)


def test_find_mpirun_finds_the_wheel_or_path():
    pytest.importorskip("mpi4py")
    path = mpi_command.find_mpirun({"PATH": os.environ.get("PATH", "")})
    assert os.access(path, os.X_OK) and os.path.basename(path) == "mpirun"


def test_mpirun_command_flags_and_per_rank_contexts():
    argv = mpi_command.mpirun_command(
        ["python", "train.py"],
        mpirun="/x/mpirun",
        hosts=["algo-1", "algo-2"],
        processes_per_host=2,
        per_rank_env=True,
        env_vars={"A": "1"},
        allow_run_as_root=True,
        oversubscribe=True,
    )
    assert argv[:5] == ["/x/mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    contexts = " ".join(argv[5:]).split(" : ")
    assert len(contexts) == 4
    assert contexts[3].startswith("-np 1 -x A=1 -x HOROVOD_HOSTNAME=algo-2 -x HOROVOD_RANK=3")
    assert "-x HOROVOD_LOCAL_RANK=1" in contexts[3] and "-x HOROVOD_CROSS_RANK=1" in contexts[3]
    assert contexts[3].endswith("python train.py")
    plain = mpi_command.mpirun_command(
        ["p"], 3, mpirun="m", allow_run_as_root=False, oversubscribe=False
    )
    assert plain == ["m", "--bind-to", "none", "-np", "3", "p"]


def test_rank_env_layout():
    env = mpi_command.rank_env(["algo-1", "algo-2", "algo-3"], 2, 5)
    assert env == {
        "HOROVOD_HOSTNAME": "algo-3",
        "HOROVOD_RANK": "5",
        "HOROVOD_SIZE": "6",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "2",
        "HOROVOD_CROSS_SIZE": "3",
    }


def test_launcher_env_as_root_sets_permission_pair(monkeypatch):
    monkeypatch.setattr(mpi_command, "is_root", lambda: True)
    env = mpi_command.launcher_env({"PATH": "/bin"})
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"


# ---------------------------------------------------------------- timeline
def test_timeline_stream_is_valid_chrome_trace(tmp_path):
    tl = timeline.Timeline(
        tmp_path / "t.json", rank=1, size=2, hostname="algo-2", origin_us=timeline.now_us()
    )
    t0 = timeline.now_us()
    tl.complete("ALLREDUCE", "collective", t0, t0 + 5, 0, {"tensor": "w", "bytes": 4})
    tl.close_stream()
    events = json.loads((tmp_path / "t.rank1.json").read_text())
    x = [e for e in events if e["ph"] == "X"]
    assert (
        x[0]["name"] == "ALLREDUCE"
        and x[0]["pid"] == 1
        and x[0]["dur"] == pytest.approx(5, abs=0.01)
    )
    assert any(e["name"] == "process_name" and "algo-2" in e["args"]["name"] for e in events)
    tl.write_merged([[{"ph": "X", "name": "a", "pid": 0}], tl.events()])
    merged = json.loads((tmp_path / "t.json").read_text())
    assert {e["pid"] for e in merged} == {0, 1}


def test_rank_path():
    assert str(timeline.rank_path("/a/b/trace.json", 3)) == "/a/b/trace.rank3.json"
    assert str(timeline.rank_path("/a/trace", 0)) == "/a/trace.rank0.json"
