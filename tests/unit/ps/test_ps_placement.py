"""Placement policies: balance, determinism, exact reassembly of sliced tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shipyard.ps.errors import PSConfigError
from shipyard.ps.placement import (
    TensorSpec,
    as_specs,
    greedy_bytes,
    imbalance,
    place,
    reassemble,
    round_robin,
    sliced,
)

# the tutorial CNN (conv32-conv32-pool-conv64-conv64-pool-dense512-dense10), valid padding
CNN = [
    TensorSpec("conv1.weight", (32, 3, 3, 3)),
    TensorSpec("conv1.bias", (32,)),
    TensorSpec("conv2.weight", (32, 32, 3, 3)),
    TensorSpec("conv2.bias", (32,)),
    TensorSpec("conv3.weight", (64, 32, 3, 3)),
    TensorSpec("conv3.bias", (64,)),
    TensorSpec("conv4.weight", (64, 64, 3, 3)),
    TensorSpec("conv4.bias", (64,)),
    TensorSpec("dense1.weight", (512, 1600)),
    TensorSpec("dense1.bias", (512,)),
    TensorSpec("dense2.weight", (10, 512)),
    TensorSpec("dense2.bias", (10,)),
]


def shard_of(p):
    return {k.spec.name: k.shards for k in p.keys}


def test_round_robin_is_creation_order_modulo_shards():
    p = round_robin(CNN, 3)
    assert [k.chunks[0].shard for k in p.keys] == [i % 3 for i in range(len(CNN))]
    assert [k.chunks[0].key_id for k in p.keys] == list(range(len(CNN)))
    assert sum(p.shard_bytes) == sum(s.nbytes for s in CNN)


def test_greedy_puts_largest_first_on_least_loaded():
    specs = [
        TensorSpec("a", (10,)),
        TensorSpec("b", (100,)),
        TensorSpec("c", (60,)),
        TensorSpec("d", (50,)),
    ]
    p = greedy_bytes(specs, 2)
    # b (400 B) -> 0, c (240) -> 1, d (200) -> 1, a (40) -> 0
    assert shard_of(p) == {"a": [0], "b": [0], "c": [1], "d": [1]}
    assert p.shard_bytes == (440, 440)
    assert p.imbalance == pytest.approx(1.0)


def test_greedy_beats_round_robin_on_a_skewed_model():
    specs = [
        TensorSpec("big", (1000,)),
        TensorSpec("s1", (10,)),
        TensorSpec("med", (900,)),
        TensorSpec("s2", (10,)),
    ]
    rr, gb = round_robin(specs, 2), greedy_bytes(specs, 2)
    assert rr.imbalance > 1.8  # big and med land on shard 0
    assert gb.imbalance < 1.06


def test_policies_are_deterministic_and_independent_of_call_order():
    for fn in (round_robin, greedy_bytes, sliced):
        a = fn(CNN, 4, 1 << 16)
        b = fn(list(CNN), 4, 1 << 16)
        assert a == b
        assert a.to_json() == b.to_json()


def test_sliced_splits_only_big_tensors_into_fixed_chunks_over_all_shards():
    chunk = 1 << 18  # 256 KiB
    p = sliced(CNN, 2, chunk)
    dense = p["dense1.weight"]
    per = chunk // 4
    assert len(dense.chunks) == -(-512 * 1600 // per)
    assert all(c.length == per for c in dense.chunks[:-1])
    assert sum(c.length for c in dense.chunks) == 512 * 1600
    assert [c.offset for c in dense.chunks] == [i * per for i in range(len(dense.chunks))]
    assert dense.shards == [0, 1]
    assert all(
        len(p[s.name].chunks) == 1 and p[s.name].chunks[0].whole for s in CNN if s.nbytes <= chunk
    )
    ids = [c.key_id for k in p.keys for c in k.chunks]
    assert ids == list(range(len(ids)))  # creation order, chunk by chunk
    assert p.imbalance < 1.05


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64"])
def test_sliced_chunks_reassemble_exactly(dtype):
    rng = np.random.default_rng(0)
    value = (rng.standard_normal((37, 53, 3)) * 1000).astype(dtype)
    spec = TensorSpec.of("w", value)
    p = sliced([spec, TensorSpec("tiny", (3,))], 3, chunk_bytes=1000)
    kp = p["w"]
    assert len(kp.chunks) > 3
    flat = value.reshape(-1)
    parts = {c.index: flat[c.offset : c.offset + c.length].copy() for c in kp.chunks}
    out = reassemble(spec, parts, kp)
    assert out.dtype == value.dtype and out.shape == value.shape
    assert np.array_equal(out, value)


def test_auto_picks_lowest_imbalance_and_reports_all_three():
    one_big = [TensorSpec("emb", (1_000_000,)), TensorSpec("b", (10,))]
    r = place(one_big, 2, "auto", chunk_bytes=1 << 20)
    assert r.chosen.policy == "sliced"
    assert set(r.imbalances) == {"round_robin", "greedy_bytes", "sliced"}
    assert r.imbalances["sliced"] < r.imbalances["greedy_bytes"] <= r.imbalances["round_robin"]
    # when all tie, the policy with fewest messages (round_robin) wins
    even = [TensorSpec(f"t{i}", (100,)) for i in range(4)]
    assert place(even, 2).chosen.policy == "round_robin"
    doc = r.to_json()
    json.dumps(doc)
    assert doc["policy"] == "sliced" and doc["requested_policy"] == "auto"
    assert doc["placement"][0]["key"] == "emb" and doc["placement"][0]["shard"] == [0, 1]
    assert sum(doc["shard_bytes"]["sliced"]) == 4_000_040


def test_explicit_policy_is_respected():
    r = place(CNN, 2, "round_robin")
    assert r.chosen.policy == "round_robin"
    assert r.chosen == r.candidates["round_robin"]


def test_imbalance_definition():
    assert imbalance([10, 10]) == 1.0
    assert imbalance([30, 10]) == 1.5
    assert imbalance([0, 0, 0]) == 1.0
    assert imbalance([12, 0, 0]) == 3.0


def test_bad_input_is_refused_clearly():
    with pytest.raises(PSConfigError, match="unknown placement policy 'fastest'"):
        place(CNN, 2, "fastest")
    with pytest.raises(PSConfigError, match="num_shards"):
        round_robin(CNN, 0)
    with pytest.raises(PSConfigError, match="chunk_bytes"):
        sliced(CNN, 2, 0)
    with pytest.raises(PSConfigError, match="appears twice"):
        as_specs([("a", np.zeros(2)), ("a", np.zeros(3))])
    with pytest.raises(PSConfigError, match="negative"):
        TensorSpec("x", (2, -1))
    # PSConfigError is a ValueError, like the rest of shipyard's validation errors
    with pytest.raises(ValueError):
        place(CNN, 2, "nope")


def test_more_shards_than_tensors_leaves_shards_empty_but_valid():
    p = greedy_bytes([TensorSpec("a", (4,))], 3)
    assert p.shard_bytes == (16, 0, 0)
    assert p.imbalance == 3.0
    assert sliced([TensorSpec("a", (3,))], 3, 4).imbalance == pytest.approx(1.0)  # one element each
