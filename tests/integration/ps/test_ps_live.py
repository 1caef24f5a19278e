"""Live shards (real processes, real sockets) with real clients.

Every shard here is ``python -m shipyard.ps.server`` started by
``shipyard.ps.launch.start_shards``; clients are PSClient over TCP (SocketTransport). Waits are
on observable state (a shard's STATS says a request is held), never on sleeps,
and every wait has a generous bound so a slow machine only makes tests slower.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from shipyard.ps.client import PSClient
from shipyard.ps.consistency import Consistency
from shipyard.ps.core import ServerConfig, ServerCore
from shipyard.ps.errors import PSConfigError, PSTimeoutError
from shipyard.ps.launch import start_shards, stop_shards
from shipyard.ps.transport import LocalNetwork

SECRET = "integration-secret"
SRC = str(Path(__file__).resolve().parents[3] / "src")


@pytest.fixture
def cluster(tmp_path):
    """cluster(n, **options) -> list[ShardProcess]; all stopped at teardown."""
    started = []

    def start(n=2, **options):
        shards = start_shards(n, SECRET, run_dir=str(tmp_path / f"run{len(started)}"), **options)
        started.extend(shards)
        return shards

    yield start
    stop_shards([s for s in started if s.alive], timeout=10)


def connect(shards, rank=0, **kw):
    kw.setdefault("timeout", 30)
    kw.setdefault("heartbeat_interval", 0.2)
    return PSClient([s.endpoint for s in shards], worker_id=rank, secret=SECRET, **kw)


def wait_until(pred, timeout=30.0, what="condition"):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached in {timeout}s")
        time.sleep(0.01)


def held(observer, worker):
    """Number of requests of ``worker`` a shard is holding back, summed over shards."""
    return sum(s["workers"].get(str(worker), {}).get("waiting", 0) for s in observer.shard_stats())


def model(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "conv.weight": rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
        "conv.bias": np.zeros(16, np.float32),
        "fc.weight": rng.standard_normal((300, 1000)).astype(np.float32),  # 1.2 MB: sliced
        "fc.bias": np.zeros(300, np.float32),
    }


def test_push_pull_over_sockets_matches_the_math(cluster):
    shards = cluster(2)
    p = model()
    with connect(shards) as c:
        vals = c.register(
            p, {"name": "sgd", "lr": 0.1, "momentum": 0.9}, policy="sliced", chunk_bytes=256 * 1024
        )
        assert c.placement("fc.weight").shards == [0, 1]
        for k in p:
            assert np.array_equal(vals[k], p[k])
        rng = np.random.default_rng(1)
        expected = {k: v.copy() for k, v in p.items()}
        buf = {k: None for k in p}
        for _ in range(3):
            g = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()}
            out = c.push_pull(g)
            for k in p:  # torch's SGD with momentum, first step buf = g
                buf[k] = g[k].copy() if buf[k] is None else 0.9 * buf[k] + g[k]
                expected[k] = expected[k] - 0.1 * buf[k]
                np.testing.assert_allclose(out[k], expected[k], rtol=1e-5, atol=1e-6)
        rep = c.stats()
        assert rep["traffic"]["workers"] == [0]
        assert all(
            x > 3 * 0.4 * 1.2e6 for x in rep["traffic"]["bytes_to_shard"][0]
        )  # both shards got fc chunks
        assert rep["shards"][0]["endpoint"] == shards[0].endpoint


def test_async_and_sync_with_two_workers(cluster):
    one = {"x": np.ones(4, np.float32)}
    # async: every push is applied as it arrives
    shards = cluster(2)
    a, b = connect(shards, 0), connect(shards, 1)
    a.register({"x": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 1.0})
    b.register({"x": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 1.0})
    assert a.push_pull(one)["x"][0] == -1.0
    assert b.push_pull({"x": np.full(4, 3.0, np.float32)})["x"][0] == -4.0
    a.close(), b.close()
    # sync: one averaged update per step, and a worker waits for the other
    shards = cluster(2, consistency="sync")
    a, b = connect(shards, 0), connect(shards, 1)
    for c in (a, b):
        c.register({"x": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 1.0})
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, one)
        wait_until(lambda: held(b, 0) > 0, what="worker 0 held by the sync round")
        assert not fut.done()
        out_b = b.push_pull({"x": np.full(4, 3.0, np.float32)})
        out_a = fut.result(timeout=30)
    np.testing.assert_allclose(out_a["x"], -2.0)  # mean(1, 3)
    np.testing.assert_allclose(out_b["x"], -2.0)
    assert sum(s["sync_rounds"] for s in a.shard_stats()) == 1
    a.close(), b.close()


def test_staleness_bound_blocks_the_fast_worker(cluster):
    shards = cluster(1, max_staleness=1)
    a, b = connect(shards, 0), connect(shards, 1)
    for c in (a, b):
        c.register({"x": np.zeros(2, np.float32)}, {"name": "sgd", "lr": 1.0})
    one = {"x": np.ones(2, np.float32)}
    a.push_pull(one)
    a.push_pull(one)
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, one)  # step 2 while b has done nothing: 2 - 0 > 1
        wait_until(lambda: held(b, 0) > 0, what="worker 0 held by the staleness bound")
        assert not fut.done()
        b.push_pull(one)
        assert fut.result(timeout=30)["x"][0] == -4.0
    a.close(), b.close()


WORKER_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from shipyard.ps import PSClient
    ps = PSClient(timeout=60)
    params = ps.register({"x": np.zeros(3, np.float32)}, {"name": "sgd", "lr": 1.0})
    print(json.dumps({"step": ps.step, "x": params["x"].tolist()}), flush=True)
    for line in sys.stdin:            # one gradient per line; the test decides when
        out = ps.push_pull({"x": np.full(3, float(line), np.float32)})
        print(json.dumps({"step": ps.step, "x": out["x"].tolist()}), flush=True)
    ps.close()
""")


def spawn_worker(tmp_path, shards, rank):
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = dict(
        os.environ,
        SHIPYARD_PS_SECRET=SECRET,
        SHIPYARD_PS_RANK=str(rank),
        SHIPYARD_PS_ENDPOINTS=",".join(s.endpoint for s in shards),
        SHIPYARD_PS_HEARTBEAT="0.2",
        PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_sync_survives_a_killed_worker_and_a_restarted_one_rejoins(cluster, tmp_path):
    shards = cluster(1, consistency="sync", heartbeat_timeout=2.0)  # 10 missed 0.2 s heartbeats
    a = connect(shards, 0)
    a.register({"x": np.zeros(3, np.float32)}, {"name": "sgd", "lr": 1.0})
    w = spawn_worker(tmp_path, shards, 1)
    try:
        assert json.loads(w.stdout.readline())["x"] == [0, 0, 0]
        with ThreadPoolExecutor(1) as ex:  # a full step with both workers
            fut = ex.submit(a.push_pull, {"x": np.ones(3, np.float32)})
            w.stdin.write("3\n")
            w.stdin.flush()
            assert json.loads(w.stdout.readline())["x"] == [-2, -2, -2]
            np.testing.assert_allclose(fut.result(timeout=30)["x"], -2.0)
        w.kill()  # dies without a word (no LEAVE)
        w.wait()
        # the next step waits for the dead worker only until its heartbeats are missed
        out = a.push_pull({"x": np.ones(3, np.float32)})
        np.testing.assert_allclose(out["x"], -3.0)
        assert a.shard_stats()[0]["live_workers"] == [0]
        # restarted, it rejoins and pulls the current parameters
        w = spawn_worker(tmp_path, shards, 1)
        first = json.loads(w.stdout.readline())
        assert first["x"] == [-3, -3, -3] and first["step"] >= 1
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(a.push_pull, {"x": np.ones(3, np.float32)})
            w.stdin.write("5\n")
            w.stdin.flush()
            assert json.loads(w.stdout.readline())["x"] == [-6, -6, -6]
            np.testing.assert_allclose(fut.result(timeout=30)["x"], -6.0)
        w.stdin.close()
        assert w.wait(timeout=30) == 0
    finally:
        if w.poll() is None:
            w.kill()
    a.close()


def test_checkpoint_and_restart_resume_exactly(cluster, tmp_path, monkeypatch):
    ckdir = tmp_path / "checkpoints"
    p = model(3)
    opt = {"name": "adam", "lr": 0.01, "weight_decay": 0.01}
    rng = np.random.default_rng(7)
    grads = [
        {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()} for _ in range(5)
    ]
    # reference: the same five steps without interruption, in process
    net = LocalNetwork([ServerCore(ServerConfig(index=i, num_shards=2), SECRET) for i in range(2)])
    ref = PSClient(worker_id=0, secret=SECRET, transport_factory=net.connect, heartbeat_interval=0)
    ref.register(p, opt, policy="sliced", chunk_bytes=256 * 1024)
    for g in grads:
        expected = ref.push_pull(g)

    stats_file = str(tmp_path / "shard-{index}.stats.json")
    monkeypatch.setenv("SHIPYARD_PS_REPORT", str(tmp_path / "report.json"))
    shards = cluster(2, checkpoint_dir=str(ckdir), checkpoint_interval=0, stats_file=stats_file)
    with connect(shards) as c:
        c.register(p, opt, policy="sliced", chunk_bytes=256 * 1024)
        for g in grads[:3]:
            c.push_pull(g)
    report = json.loads((tmp_path / "report.json").read_text())  # written by rank 0 on close
    assert report["schema"] == "shipyard.ps.report/v1" and report["policy"] == "sliced"
    assert report["traffic"]["workers"] == [0] and all(
        x > 0 for x in report["traffic"]["bytes_to_shard"][0]
    )
    assert stop_shards(shards) == [0, 0]  # SIGTERM: clean exit after the final checkpoint
    for i in range(2):  # each shard left its own stats at exit
        st = json.loads((tmp_path / f"shard-{i}.stats.json").read_text())
        assert st["shard"] == i and st["pushes"] > 0 and st["checkpoint"]["count"] == 1
    assert sorted(x.name for x in ckdir.glob("*.json")) == [
        "ps-shard-000.json",
        "ps-shard-001.json",
    ]

    shards = cluster(2, checkpoint_dir=str(ckdir), checkpoint_interval=0)
    assert all(s.info["resumed_from"] for s in shards)
    with connect(shards) as c:
        assert c.step == 3  # the worker's step counter continues
        c.register(p, opt, policy="sliced", chunk_bytes=256 * 1024)  # rank 0's init is ignored
        for g in grads[3:]:
            out = c.push_pull(g)
        stats = c.shard_stats()
        c.shutdown_servers()
    for k in p:
        np.testing.assert_array_equal(out[k], expected[k])
    assert sum(s["updates"] for s in stats) == 5 * sum(
        len(kp.chunks) for kp in ref.report.chosen.keys
    )
    for s in shards:  # SHUTDOWN: exits by itself
        assert s.proc.wait(timeout=30) == 0
    manifest = json.loads((ckdir / "ps-shard-000.json").read_text())
    assert manifest["workers"] == {"0": 5}


def test_wrong_secret_is_dropped_and_counted(cluster):
    shards = cluster(1)
    with pytest.raises(PSTimeoutError, match="SHIPYARD_PS_SECRET"):
        PSClient([shards[0].endpoint], secret="not-the-secret", timeout=1.0, heartbeat_interval=0)
    with connect(shards) as c:
        c.register({"x": np.zeros(2, np.float32)}, "sgd")
        assert c.shard_stats()[0]["rejected"] == {"bad_mac": 1}
        assert c.pull("x").tolist() == [0, 0]


def test_message_size_limit_is_checked_before_sending(cluster):
    shards = cluster(1, max_message_bytes=64 * 1024)
    with connect(shards) as c:
        with pytest.raises(PSConfigError, match="exceeds the shards' limit"):
            c.register({"big": np.zeros(40_000, np.float32)}, "sgd", policy="round_robin")
        vals = c.register(
            {"big": np.arange(40_000, dtype=np.float32)},
            "sgd",
            policy="sliced",
            chunk_bytes=32 * 1024,
        )
        assert np.array_equal(vals["big"], np.arange(40_000))


def test_consistency_flags_are_validated_by_the_shard_process(tmp_path):
    with pytest.raises(Exception, match="unknown consistency mode"):
        start_shards(1, SECRET, run_dir=str(tmp_path), consistency="eventual", startup_timeout=30)
    with pytest.raises(Exception, match="max_staleness must be >= 0"):
        start_shards(1, SECRET, run_dir=str(tmp_path), max_staleness=-2, startup_timeout=30)
    assert Consistency.parse("async", 0).mode == "bounded"


def test_shards_do_not_outlive_their_launcher(tmp_path):
    """The classic parameter-server bug: the job ends and the PS runs forever."""
    launcher = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {SRC!r})
        from shipyard.ps.launch import start_shards
        shards = start_shards(2, "s", run_dir={str(tmp_path)!r}, checkpoint_dir={str(tmp_path / "ck")!r})
        print(",".join(str(s.proc.pid) for s in shards), flush=True)
        # exits here without stopping them
    """)
    out = subprocess.run(
        [sys.executable, "-c", launcher], capture_output=True, text=True, timeout=60
    )
    pids = [int(p) for p in out.stdout.strip().split(",")]
    import psutil

    procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    gone, alive = psutil.wait_procs(procs, timeout=20)
    assert not alive, f"shards still running after their launcher exited: {alive}"
    # they stopped the clean way: a final checkpoint each
    assert sorted(x.name for x in (tmp_path / "ck").glob("*.json")) == [
        "ps-shard-000.json",
        "ps-shard-001.json",
    ]
