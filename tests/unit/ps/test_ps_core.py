"""The shard protocol (ServerCore) driven through the client, over the in-process transport.

These tests use the transport seam (LocalNetwork) rather than sockets: the same
ServerCore and PSClient code as in production, stepped deterministically (a fake
clock for heartbeats, explicit waits on the shard's queues instead of sleeps).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from shipyard.ps import wire
from shipyard.ps.client import PSClient
from shipyard.ps.consistency import Consistency
from shipyard.ps.core import ServerConfig, ServerCore
from shipyard.ps.errors import (
    PSConfigError,
    PSTimeoutError,
    RemoteConfigMismatch,
    RemoteError,
    ShapeMismatchError,
    UnknownKeyError,
)
from shipyard.ps.shard import Shard
from shipyard.ps.transport import LocalNetwork, Transport
from shipyard.ps.wire import Header, MsgType

SECRET = "unit-secret"


def make_net(n=2, mode="async", s=None, **cfg):
    cons = Consistency.parse(mode, s)
    return LocalNetwork(
        [
            ServerCore(ServerConfig(index=i, num_shards=n, consistency=cons, **cfg), SECRET)
            for i in range(n)
        ]
    )


def client(net, rank=0, **kw):
    kw.setdefault("timeout", 20)
    return PSClient(
        worker_id=rank, secret=SECRET, transport_factory=net.connect, heartbeat_interval=0, **kw
    )


def wait_until(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


def params():
    rng = np.random.default_rng(1)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": np.zeros(3, np.float32),
        "emb": rng.standard_normal(5000).astype(np.float32),
    }


def test_push_pull_applies_sgd_on_every_chunk():
    net = make_net(3)
    c = client(net)
    p = params()
    vals = c.register(p, {"name": "sgd", "lr": 0.5}, policy="sliced", chunk_bytes=4096)
    assert len(c.placement("emb").chunks) == 5
    for k in p:
        assert np.array_equal(vals[k], p[k])
    g = {k: np.full_like(v, 2.0) for k, v in p.items()}
    out = c.push_pull(g)
    assert c.step == 1
    for k in p:
        np.testing.assert_allclose(out[k], p[k] - 1.0)
        assert out[k].shape == p[k].shape and out[k].flags.writeable
    c.push("b", np.ones(3, np.float32))
    np.testing.assert_allclose(c.pull("b"), -1.5)
    into = np.empty(5000, np.float32)
    assert c.pull("emb", out=into) is into
    np.testing.assert_allclose(into, p["emb"] - 1.0)


def test_init_first_writer_wins_and_other_ranks_wait_for_it():
    net = make_net(2)
    c1 = client(net, rank=1)
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(c1.register, {"w": np.full(4, 9.0, np.float32)}, "sgd")
        wait_until(lambda: any(1 in core.queues for core in net.cores))  # rank 1's pull is held
        assert not fut.done()
        c0 = client(net, rank=0)
        v0 = c0.register({"w": np.arange(4, dtype=np.float32)}, "sgd")
        v1 = fut.result(timeout=10)
    assert np.array_equal(v0["w"], np.arange(4)) and np.array_equal(v1["w"], np.arange(4))
    # a second init (a restarted rank 0) does not overwrite
    again = client(net, rank=0).register({"w": np.full(4, -1.0, np.float32)}, "sgd")
    assert np.array_equal(again["w"], np.arange(4))


def test_async_two_workers_each_push_applied_immediately():
    net = make_net(2)
    a, b = client(net, 0), client(net, 1)
    a.register({"x": np.zeros(2, np.float32)}, {"name": "sgd", "lr": 1.0})
    b.register({"x": np.zeros(2, np.float32)}, {"name": "sgd", "lr": 1.0})
    assert np.array_equal(a.push_pull({"x": np.ones(2, np.float32)})["x"], [-1, -1])
    assert np.array_equal(a.push_pull({"x": np.ones(2, np.float32)})["x"], [-2, -2])
    # b is behind (never pulled since init): its gradient is applied anyway, staleness 2
    assert np.array_equal(b.push_pull({"x": np.ones(2, np.float32)})["x"], [-3, -3])
    report = a.stats()
    assert report["staleness_histogram"] == {"0": 2, "2": 1}


def test_sync_averages_one_gradient_per_worker():
    net = make_net(2, "sync")
    a, b = client(net, 0), client(net, 1)
    init = {"x": np.zeros(3, np.float32), "y": np.zeros(2000, np.float32)}
    a.register(init, {"name": "sgd", "lr": 1.0}, policy="sliced", chunk_bytes=2048)
    b.register(init, {"name": "sgd", "lr": 1.0}, policy="sliced", chunk_bytes=2048)
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(
            a.push_pull, {"x": np.full(3, 2.0, np.float32), "y": np.full(2000, 2.0, np.float32)}
        )
        wait_until(lambda: all(0 in c.queues for c in net.cores))
        assert not fut.done()  # waits for worker 1's gradient
        out_b = b.push_pull({"x": np.full(3, 4.0, np.float32), "y": np.full(2000, 4.0, np.float32)})
        out_a = fut.result(timeout=10)
    for out in (out_a, out_b):
        np.testing.assert_allclose(out["x"], -3.0)  # mean(2, 4) applied once
        np.testing.assert_allclose(out["y"], -3.0)
    shard_stats = a.shard_stats()
    assert sum(s["sync_rounds"] for s in shard_stats) == 1 + 4  # x + four chunks of y
    assert all(s["updates"] == s["sync_rounds"] for s in shard_stats)


def test_sync_round_proceeds_without_a_dead_worker_and_it_can_rejoin():
    net = make_net(1, "sync", heartbeat_timeout=5.0)
    a, b = client(net, 0), client(net, 1)
    a.register({"x": np.zeros(2, np.float32)}, {"name": "sgd", "lr": 1.0})
    b.register({"x": np.zeros(2, np.float32)}, {"name": "sgd", "lr": 1.0})
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, {"x": np.ones(2, np.float32)})
        wait_until(lambda: 0 in net.cores[0].queues)
        net.advance(3.0)  # b is silent but not yet dead
        assert not fut.done()
        # keep a alive (its heartbeat thread is off in these tests) and let b time out
        net.cores[0].workers.seen(0, net.now + 3.0)
        net.advance(3.0)
        np.testing.assert_allclose(fut.result(timeout=10)["x"], -1.0)
    assert net.cores[0].workers.live() == {0}
    # b comes back (e.g. restarted): it pulls current values and takes part again
    b2 = client(net, 1)
    assert np.array_equal(
        b2.pull("x") if b2.keys else b2.register({"x": np.zeros(2, np.float32)})["x"], [-1, -1]
    )
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, {"x": np.ones(2, np.float32)})
        wait_until(lambda: 0 in net.cores[0].queues)
        b2.push_pull({"x": np.full(2, 3.0, np.float32)})
        np.testing.assert_allclose(fut.result(timeout=10)["x"], -3.0)


def test_sync_leave_releases_the_round():
    net = make_net(1, "sync")
    a, b = client(net, 0), client(net, 1)
    for c in (a, b):
        c.register({"x": np.zeros(1, np.float32)}, {"name": "sgd", "lr": 1.0})
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, {"x": np.ones(1, np.float32)})
        wait_until(lambda: 0 in net.cores[0].queues)
        b.close()  # a clean exit sends LEAVE
        np.testing.assert_allclose(fut.result(timeout=10)["x"], -1.0)


def test_bounded_staleness_blocks_the_fast_worker():
    net = make_net(2, "async", s=1)
    a, b = client(net, 0), client(net, 1)
    for c in (a, b):
        c.register({"x": np.zeros(1, np.float32)}, {"name": "sgd", "lr": 1.0})
    one = {"x": np.ones(1, np.float32)}
    a.push_pull(one)  # step 0
    a.push_pull(one)  # step 1: 1 - 0 <= 1
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, one)  # step 2: 2 - 0 > 1 -> waits for b
        wait_until(lambda: any(0 in c.queues for c in net.cores))
        assert not fut.done()
        b.push_pull(one)  # b finishes step 0 -> a may run step 2
        assert fut.result(timeout=10)["x"][0] == -4.0
    assert a.step == 3 and b.step == 1


def test_bounded_staleness_ignores_dead_workers():
    net = make_net(1, "bounded", s=0, heartbeat_timeout=2.0)
    a, b = client(net, 0), client(net, 1)
    for c in (a, b):
        c.register({"x": np.zeros(1, np.float32)}, "sgd")
    a.push_pull({"x": np.ones(1, np.float32)})
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, {"x": np.ones(1, np.float32)})
        wait_until(lambda: 0 in net.cores[0].queues)
        net.cores[0].workers.seen(0, net.now + 3.0)
        net.advance(3.0)  # b expires: nobody left to wait for
        fut.result(timeout=10)


def test_bad_requests_are_errors_on_the_client():
    net = make_net(2)
    c = client(net)
    c.register({"w": np.zeros((2, 2), np.float32), "n": np.zeros(3, np.int64)}, "sgd")
    with pytest.raises(ShapeMismatchError, match="shape"):
        c.push("w", np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeMismatchError, match="dtype"):
        c.push("w", np.zeros((2, 2), np.float64))
    with pytest.raises(UnknownKeyError, match="'nope' was not registered"):
        c.pull("nope")
    with pytest.raises(RemoteError) as ei:
        c.push("n", np.zeros(3, np.int64))
    assert ei.value.code == "not_trainable"
    with pytest.raises(PSConfigError):
        c.set_lr(-1.0)
    with pytest.raises(PSConfigError, match="unknown placement policy"):
        client(net).register({"w": np.zeros((2, 2), np.float32)}, policy="best")
    with pytest.raises(RemoteConfigMismatch, match="registered as w"):
        client(net, 1).register({"w": np.zeros((5,), np.float32)}, "sgd")
    with pytest.raises(RemoteConfigMismatch, match="optimizer group"):
        client(net, 1).register(
            {"w": np.zeros((2, 2), np.float32), "n": np.zeros(3, np.int64)}, "adam"
        )
    # the shards still serve
    assert np.array_equal(c.pull("w"), np.zeros((2, 2)))


def raw(core, mtype, key=0, payload=None, worker=5, shard=None, signer=None, **kw):
    """Send one hand-made message to a core; returns (reply message or None)."""
    signer = signer or wire.Signer(SECRET)
    kw.setdefault("peer", core.signer.session)  # addressed to this run of the shard
    hdr = Header(
        msg_type=mtype,
        key=key,
        worker=worker,
        request_id=77,
        shard=core.config.index if shard is None else shard,
        **kw,
    )
    frames = wire.encode(signer, hdr, [payload] if payload is not None else [])
    out = core.handle(b"peer", [bytes(memoryview(f).cast("B")) for f in frames], 0.0)
    if not out:
        return None
    assert len(out) == 1 and out[0].peer == b"peer"
    return wire.decode(wire.Signer(SECRET), out[0].frames)


def test_server_rejects_bad_messages_counts_them_and_keeps_serving():
    net = make_net(1)
    core = net.cores[0]
    c = client(net)
    c.register({"w": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 1.0})
    kid = c.placement("w").chunks[0].key_id
    f32 = wire.dtype_code(np.float32)

    r = raw(core, MsgType.PUSH, key=999, payload=np.ones(4, np.float32), dtype=f32, shape=(4,))
    assert r.header.msg_type == MsgType.ERROR and r.json()["code"] == "unknown_key"
    assert r.header.request_id == 77
    r = raw(core, MsgType.PUSH, key=kid, payload=np.ones(5, np.float32), dtype=f32, shape=(5,))
    assert r.json()["code"] == "shape_mismatch"
    r = raw(
        core,
        MsgType.PUSH,
        key=kid,
        payload=np.ones(4, np.float64),
        dtype=wire.dtype_code(np.float64),
        shape=(4,),
    )
    assert r.json()["code"] == "dtype_mismatch"
    r = raw(core, MsgType.PULL, key=kid, shard=3)
    assert r.json()["code"] == "wrong_shard"
    r = raw(core, MsgType.OK)
    assert r.json()["code"] == "bad_request"
    r = raw(core, MsgType.REGISTER, payload=b"{not json", flags=wire.FLAG_JSON)
    assert r.json()["code"] == "bad_request"
    r = raw(core, MsgType.SET_LR, payload=b'{"lr": "fast"}', flags=wire.FLAG_JSON)
    assert r.json()["code"] == "bad_request"
    # wrong secret: dropped without a reply
    assert raw(core, MsgType.PULL, key=kid, signer=wire.Signer("intruder")) is None
    assert core.handle(b"peer", [b"garbage"], 0.0) == []
    assert core.handle(b"peer", [], 0.0) == []
    rejected = core.stats.rejected
    assert rejected["unknown_key"] == 1 and rejected["shape_mismatch"] == 1
    assert rejected["dtype_mismatch"] == 1 and rejected["wrong_shard"] == 1
    assert rejected["bad_mac"] == 1 and rejected["malformed"] == 2 and rejected["bad_request"] == 3
    # the parameter was never touched, and the shard still serves
    assert np.array_equal(c.pull("w"), np.zeros(4))
    assert np.array_equal(c.push_pull({"w": np.ones(4, np.float32)})["w"], -np.ones(4))
    assert c.stats()["rejected"]["bad_mac"] == 1


def test_set_lr_reaches_every_shard():
    net = make_net(3)
    c = client(net)
    c.register({f"p{i}": np.zeros(2, np.float32) for i in range(6)}, {"name": "adam", "lr": 0.1})
    c.set_lr(0.01)
    assert all(s["optimizers"]["default"]["lr"] == 0.01 for s in c.shard_stats())
    with pytest.raises(RemoteError, match="no optimizer group 'head'"):
        c.set_lr(0.5, group="head")


def test_optimizer_groups():
    net = make_net(2)
    c = client(net)
    c.register(
        {"body": np.zeros(2, np.float32), "head": np.zeros(2, np.float32)},
        optimizers={"default": {"name": "sgd", "lr": 1.0}, "head": {"name": "sgd", "lr": 0.1}},
        groups={"head": "head"},
    )
    out = c.push_pull({"body": np.ones(2, np.float32), "head": np.ones(2, np.float32)})
    np.testing.assert_allclose(out["body"], -1.0)
    np.testing.assert_allclose(out["head"], -0.1)
    c.set_lr(0.5, group="head")
    np.testing.assert_allclose(c.push_pull({"head": np.ones(2, np.float32)})["head"], -0.6)


def test_report_schema_and_traffic_matrix():
    net = make_net(2)
    a, b = client(net, 0), client(net, 1)
    p = {
        "conv.weight": np.zeros((8, 3, 3, 3), np.float32),
        "fc.weight": np.zeros((10, 64), np.float32),
        "fc.bias": np.zeros(10, np.float32),
    }
    a.register(p, "sgd")
    b.register(p, "sgd")
    a.push_pull({k: np.ones_like(v) for k, v in p.items()})
    b.pull("fc.bias")
    rep = a.stats()
    json.dumps(rep)
    assert rep["schema"] == "shipyard.ps.report/v1"
    assert set(rep["imbalance"]) == {"round_robin", "greedy_bytes", "sliced"}
    assert rep["policy"] in rep["imbalance"]
    assert [e["key"] for e in rep["placement"]] == list(p)
    assert sum(s["bytes"] for s in rep["shards"]) == sum(v.nbytes for v in p.values())
    tr = rep["traffic"]
    assert tr["workers"] == [0, 1] and tr["shards"] == [0, 1]
    assert len(tr["bytes_to_shard"]) == 2 and len(tr["bytes_to_shard"][0]) == 2
    # worker 0 pushed every tensor: it sent at least the tensor bytes to the shards
    assert sum(tr["bytes_to_shard"][0]) > sum(v.nbytes for v in p.values())
    assert sum(tr["bytes_from_shard"][0]) > 2 * sum(
        v.nbytes for v in p.values()
    )  # register pull + push_pull
    # the matrix adds up to the shards' own counters
    for j, s in enumerate(rep["shards"]):
        assert sum(row[j] for row in tr["bytes_to_shard"]) == s["bytes_in"]
        assert sum(row[j] for row in tr["bytes_from_shard"]) == s["bytes_out"]
        assert s["endpoint"] == f"shard-{j}"


def test_checkpoint_restore_in_process(tmp_path):
    net = make_net(2, checkpoint_dir=str(tmp_path))
    c = client(net)
    p = params()
    c.register(p, {"name": "adam", "lr": 0.01}, policy="sliced", chunk_bytes=4096)
    rng = np.random.default_rng(3)
    grads = [
        {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()} for _ in range(4)
    ]
    for g in grads[:2]:
        c.push_pull(g)
    paths = c.checkpoint()
    assert all(path and path.endswith(".json") for path in paths)
    expected = c.pull_all()
    for g in grads[2:]:
        final = c.push_pull(g)
    # a fresh set of shards resumes from the checkpoint: values, Adam state, steps
    net2 = make_net(2, checkpoint_dir=str(tmp_path))
    assert all(core.resumed_from for core in net2.cores)
    c2 = client(net2)
    assert c2.step == 2
    got = c2.register(p, {"name": "adam", "lr": 0.01}, policy="sliced", chunk_bytes=4096)
    for k in p:
        assert np.array_equal(got[k], expected[k])  # rank 0's init did not overwrite
    for g in grads[2:]:
        out = c2.push_pull(g)
    for k in p:
        assert np.array_equal(out[k], final[k])  # continued exactly, moments included
    assert c2.step == 4


def test_copy_on_write_keeps_in_flight_buffers_intact():
    class Tracker:
        done = False

    shard = Shard(0, 1)
    shard.register(
        [{"id": 0, "name": "w", "shape": [3], "dtype": "float32"}], {"name": "sgd", "lr": 1.0}
    )
    slot = shard.slots[0]
    shard.init(slot, np.zeros(3, np.float32))
    sent, _ = shard.payload(slot)
    t = Tracker()
    slot.inflight.append(t)
    shard.apply(slot, np.ones(3, np.float32))
    assert np.array_equal(sent, np.zeros(3)) and np.array_equal(slot.value, -np.ones(3))
    assert slot.value is not sent
    t.done = True
    slot.inflight.append(Tracker())
    shard.apply(slot, np.ones(3, np.float32))  # the old buffer is free again: reused
    assert slot.value is sent and np.array_equal(slot.value, -2 * np.ones(3))


def test_client_config_errors(monkeypatch):
    net = make_net(1)
    monkeypatch.delenv("SHIPYARD_PS_ENDPOINTS", raising=False)
    with pytest.raises(PSConfigError, match="SHIPYARD_PS_ENDPOINTS"):
        PSClient(secret=SECRET)
    with pytest.raises(PSConfigError, match="worker_id"):
        PSClient(worker_id=-1, secret=SECRET, transport_factory=net.connect)
    monkeypatch.setenv("SHIPYARD_PS_RANK", "three")
    with pytest.raises(PSConfigError, match="SHIPYARD_PS_RANK"):
        PSClient(secret=SECRET, transport_factory=net.connect)
    # endpoints listed out of shard order are caught at connect time
    net2 = make_net(2)
    net2.cores.reverse()
    with pytest.raises(PSConfigError, match="shard order"):
        PSClient(worker_id=0, secret=SECRET, transport_factory=net2.connect, heartbeat_interval=0)


def test_heartbeats_keep_a_quiet_worker_alive():
    net = make_net(1, heartbeat_timeout=1.0)
    c = PSClient(worker_id=4, secret=SECRET, transport_factory=net.connect, heartbeat_interval=0.01)
    try:
        before = net.cores[0].stats.messages_in
        wait_until(lambda: net.cores[0].stats.messages_in >= before + 3)
        assert net.cores[0].workers.is_live(4)
    finally:
        c.close()
    assert not net.cores[0].workers.is_live(4)  # LEAVE on close
    assert threading.active_count() < 50


def test_sync_quorum_waits_for_the_expected_workers_to_join():
    net = make_net(1, "sync", expected_workers=2)
    a = client(net, 0)
    a.register({"x": np.zeros(1, np.float32)}, {"name": "sgd", "lr": 1.0})
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(a.push_pull, {"x": np.ones(1, np.float32)})
        wait_until(lambda: 0 in net.cores[0].queues)
        assert not fut.done()  # alone, but a second worker is expected
        b = client(net, 1)
        b.register({"x": np.zeros(1, np.float32)}, {"name": "sgd", "lr": 1.0})
        assert not fut.done()  # b joined; the round now needs b's gradient too
        b.push_pull({"x": np.full(1, 3.0, np.float32)})
        assert fut.result(timeout=10)["x"][0] == -2.0


def test_periodic_checkpoint_is_due_only_after_changes(tmp_path):
    clock = [0.0]
    core = ServerCore(
        ServerConfig(checkpoint_dir=str(tmp_path), checkpoint_interval=5.0),
        SECRET,
        clock=lambda: clock[0],
    )
    net = LocalNetwork([core])
    c = client(net)
    c.register({"x": np.zeros(2, np.float32)}, "sgd")
    clock[0] = 6.0
    assert core.checkpoint_due()  # init made it dirty
    core.checkpoint()
    assert not core.checkpoint_due()
    clock[0] = 20.0
    assert not core.checkpoint_due()  # nothing changed since
    c.push("x", np.ones(2, np.float32))
    assert core.checkpoint_due()
    assert ServerConfig(checkpoint_interval=0).checkpoint_interval == 0
    with pytest.raises(PSConfigError):
        ServerConfig(index=2, num_shards=2)


# -- several small tensors in one message (PUSH_PULL_MANY) ---------------------------------
def many_params():
    rng = np.random.default_rng(3)
    out = {f"bias{i}": rng.standard_normal(7 + i).astype(np.float32) for i in range(6)}
    out["big"] = rng.standard_normal(40_000).astype(np.float32)  # 160 KB: sent on its own
    return out


def train_steps(clients, steps, grouped):
    """``steps`` push_pulls per client (threads, so sync rounds can complete); returns
    the final values and the number of data messages the shards received."""
    for c in clients:
        c._state.many = c._state.many and grouped
    init = many_params()
    for c in clients:
        c.register(
            init,
            {"name": "sgd", "lr": 0.1, "momentum": 0.9},
            policy="sliced",
            chunk_bytes=64 * 1024,
        )
    results = []

    def run(rank, c):
        out = None
        for s in range(steps):
            grads = {k: np.cos(v * (s + 1) + rank) for k, v in init.items()}
            out = c.push_pull(grads)
        return out

    with ThreadPoolExecutor(len(clients)) as ex:
        results = list(ex.map(lambda rc: run(*rc), enumerate(clients)))
    stats = clients[0].shard_stats()
    return results, sum(s["messages_in"] for s in stats)


@pytest.mark.parametrize("mode,s", [("async", None), ("bounded", 1), ("sync", None)])
def test_small_tensors_share_one_message_with_the_same_result(mode, s):
    workers = 1 if mode == "async" else 2
    runs = {}
    for grouped in (True, False):
        net = make_net(2, mode, s)
        runs[grouped] = train_steps([client(net, r) for r in range(workers)], 4, grouped)
    (grouped, n_grouped), (plain, n_plain) = runs[True], runs[False]
    if mode != "bounded":  # two free-running workers interleave differently run to run
        for g, p in zip(grouped, plain):
            for k in p:
                np.testing.assert_allclose(g[k], p[k], rtol=1e-6, atol=1e-7, err_msg=k)
    # per step: 6 biases and big's last chunk (28 KB) are small, on 2 shards -> 2 messages
    # instead of 7; big's two 64 KiB chunks go alone (hello/register/init/stats alike)
    assert n_plain - n_grouped == 5 * 4 * workers


def test_bad_push_pull_many_is_refused_whole():
    net = make_net(1)
    core = net.cores[0]
    c = client(net)
    c.register(
        {"a": np.zeros(4, np.float32), "b": np.zeros(2, np.float32), "n": np.zeros(3, np.int32)},
        {"name": "sgd", "lr": 1.0},
    )
    ka, kb, kn = (c.placement(k).chunks[0].key_id for k in ("a", "b", "n"))
    assert "push_pull_many" in c.shard_info[0]["features"] and c._state.many

    def many(keys, frames, index=None, **kw):
        hdr = Header(
            msg_type=MsgType.PUSH_PULL_MANY,
            worker=5,
            request_id=78,
            shard=0,
            peer=core.signer.session,
            **kw,
        )
        idx = wire.pack_keys(keys) if index is None else index
        sent = wire.encode(wire.Signer(SECRET), hdr, [idx, *frames])
        out = core.handle(b"peer", [bytes(memoryview(f).cast("B")) for f in sent], 0.0)
        assert len(out) == 1
        return wire.decode(wire.Signer(SECRET), out[0].frames)

    ones4, ones2 = np.ones(4, np.float32), np.ones(2, np.float32)
    for keys, frames, index, code in [
        ([ka, 999], [ones4, ones2], None, "unknown_key"),
        ([ka, kb], [ones4, np.ones(3, np.float32)], None, "shape_mismatch"),
        ([ka, ka], [ones4, ones4], None, "bad_request"),  # a key twice
        ([ka, kb], [ones4, ones2], b"\x01\x00", "bad_request"),  # index of the wrong size
        ([ka, kn], [ones4, np.ones(3, np.int32)], None, "not_trainable"),
        ([], [], b"", "bad_request"),  # nothing to push
    ]:
        r = many(keys, frames, index)
        assert r.header.msg_type == MsgType.ERROR and r.json()["code"] == code, (keys, r.json())
        assert r.header.request_id == 78
    # a refused message applied nothing, even to its valid members
    assert np.array_equal(c.pull("a"), np.zeros(4)) and np.array_equal(c.pull("b"), np.zeros(2))
    r = many([ka, kb], [ones4, ones2])
    assert r.header.msg_type == MsgType.TENSORS
    keys, versions = wire.unpack_keys(r.payload[0], 2, versions=True)
    assert keys == [ka, kb] and versions == [1, 1]
    assert np.array_equal(np.frombuffer(r.payload[1], np.float32), -ones4)
    assert np.array_equal(c.push_pull({"a": ones4, "b": ones2})["b"], -2 * ones2)


def test_push_pull_begin_holds_small_tensors_back_and_keeps_their_order():
    net = make_net(2)
    c = client(net)
    c.register(
        {
            "a": np.zeros(4, np.float32),
            "b": np.zeros(3, np.float32),
            "big": np.zeros(20_000, np.float32),
        },
        {"name": "sgd", "lr": 1.0},
    )
    one = {k: np.ones(n, np.float32) for k, n in (("a", 4), ("b", 3), ("big", 20_000))}
    c.push_pull_begin({"a": one["a"]})
    c.push_pull_begin({"b": one["b"]})
    assert len(c._data.bucket) == 2 and not c._data.open  # nothing on the wire yet
    c.push_pull_begin({"a": one["a"]})  # "a" again before the end: the held ones go first
    assert len(c._data.bucket) == 1 and c._data.open
    c.push_pull_begin({"big": one["big"]})  # 80 KB: on the wire at once
    out = c.push_pull_end()
    assert not c._data.bucket
    np.testing.assert_array_equal(out["a"], -2 * one["a"])  # both pushes applied, in order
    np.testing.assert_array_equal(out["b"], -one["b"])
    np.testing.assert_array_equal(out["big"], -one["big"])
    c.push_pull_begin({"b": one["b"]})  # held, then a blocking push_pull sends it first
    np.testing.assert_array_equal(c.push_pull({"b": one["b"]})["b"], -3 * one["b"])
    np.testing.assert_array_equal(c.push_pull_end()["b"], -2 * one["b"])


def test_a_captured_push_resent_is_applied_once_and_counted():
    """The bug: a correctly signed PUSH re-sent three times was applied three times."""
    net = make_net(1)
    core = net.cores[0]
    c = client(net)
    c.register({"w": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 1.0})
    kid = c.placement("w").chunks[0].key_id
    f32 = wire.dtype_code(np.float32)
    hdr = Header(
        msg_type=MsgType.PUSH,
        key=kid,
        worker=5,
        request_id=9,
        dtype=f32,
        shape=(4,),
        peer=core.signer.session,
    )
    captured = [
        bytes(memoryview(f).cast("B"))
        for f in wire.encode(wire.Signer(SECRET), hdr, [np.ones(4, np.float32)])
    ]
    first = core.handle(b"peer", captured, 0.0)
    assert (
        len(first) == 1
        and wire.decode(wire.Signer(SECRET), first[0].frames).header.msg_type == MsgType.OK
    )
    for _ in range(3):  # replayed: dropped without a reply, never applied
        assert core.handle(b"attacker", captured, 0.0) == []
    assert core.stats.rejected["replayed"] == 3
    assert np.array_equal(c.pull("w"), -np.ones(4))  # one update, not four
    # a message numbered below the window, or addressed to another run, is refused too
    old = wire.Signer(SECRET)
    early = wire.encode(old, Header(msg_type=MsgType.STATS, worker=5, peer=core.signer.session))
    for _ in range(wire.ReplayGuard.WINDOW + 1):
        old.next_seq()  # numbers used on messages sent elsewhere
    late = wire.encode(old, Header(msg_type=MsgType.STATS, worker=5, peer=core.signer.session), [])
    assert core.handle(b"p", late, 0.0)  # fresh: answered
    assert core.handle(b"p", early, 0.0) == []  # never seen, but older than the window
    assert core.stats.rejected["replayed"] == 4
    restarted = ServerCore(ServerConfig(index=0, num_shards=1), SECRET)  # a new run of the shard
    assert restarted.handle(b"p", captured, 0.0) == []
    assert restarted.stats.rejected["stale_session"] == 1


class _Meddling(Transport):
    """Around a LocalTransport, handing frames over as ``bytes`` (as the socket stream
    does): before each reply comes a copy of the previous reply from that shard (a
    duplicate or a captured reply re-sent) and a frame list that answers no request;
    with ``drop``, requests vanish."""

    def __init__(self, inner: Transport, drop: bool = False) -> None:
        self.inner, self.drop, self.num_shards = inner, drop, inner.num_shards
        self.queued: list[deque] = [deque() for _ in range(inner.num_shards)]
        self.last: list[list[bytes] | None] = [None] * inner.num_shards

    def send(self, shard, frames):
        if not self.drop:
            self.inner.send(shard, frames)

    def poll(self, timeout):
        return [i for i, q in enumerate(self.queued) if q] or self.inner.poll(timeout)

    def recv(self, shard):
        if not self.queued[shard]:
            real = [bytes(memoryview(f).cast("B")) for f in self.inner.recv(shard)]
            before = [] if self.last[shard] is None else [self.last[shard]]
            self.queued[shard].extend([*before, [b"\0" * wire.HEADER_SIZE, b"x"], real])
            self.last[shard] = real
        return self.queued[shard].popleft()


def test_one_request_push_pull_drops_stale_and_stray_replies_and_times_out():
    """push_pull of one small tensor takes the one-request path (client_data
    ._push_pull_one): a repeated earlier reply and a reply to no request are dropped, the
    value and the step are right; a shard that never answers is a PSTimeoutError."""
    net = make_net(1)
    c = PSClient(
        worker_id=0,
        secret=SECRET,
        heartbeat_interval=0,
        timeout=20,
        transport_factory=lambda: _Meddling(net.connect()),
    )
    c.register({"w": np.zeros(4, np.float32)}, {"name": "sgd", "lr": 1.0})
    out = np.empty(4, np.float32)
    for step in range(1, 4):
        got = c.push_pull({"w": np.ones(4, np.float32)}, outs={"w": out})
        assert got["w"] is out and np.array_equal(out, -step * np.ones(4)) and c.step == step
    fresh = c.push_pull({"w": np.ones(4, np.float32)})["w"]  # no out: a writable copy
    assert fresh.flags.writeable and np.array_equal(fresh, -4 * np.ones(4))
    c.close()
    silent = PSClient(
        worker_id=1,
        secret=SECRET,
        heartbeat_interval=0,
        timeout=0.3,
        transport_factory=lambda: _Meddling(net.connect(), drop=True),
        connect=False,
    )
    silent._state.peers = [net.cores[0].signer.session]
    silent._state.keys = c._state.keys
    with pytest.raises(PSTimeoutError, match="no reply within 0.3s from shard 0"):
        silent.push_pull({"w": np.ones(4, np.float32)})
    silent.close(leave=False)
