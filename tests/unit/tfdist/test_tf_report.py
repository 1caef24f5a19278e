"""The TensorFlow placement/traffic report, from recorded variables and relay counters."""

from __future__ import annotations

from shipyard.tf import report
from shipyard.tf.placement import ps_task_of


def var(name, shape, ps, dtype="float32", size=4, trainable=True):
    numel = 1
    for d in shape:
        numel *= d
    return {
        "name": name,
        "shape": shape,
        "dtype": dtype,
        "bytes": numel * size,
        "device": "" if ps is None else f"/job:ps/replica:0/task:{ps}/device:CPU:0",
        "trainable": trainable,
        "ps_task": ps,
    }


def stats(started, relay, peers, points=()):
    return {
        "started": started,
        "relays": {
            relay: {
                p: {"bytes_in": a, "bytes_out": b, "connections": 1} for p, (a, b) in peers.items()
            }
        },
        "timeline": {"interval_s": 1.0, "points": list(points)},
    }


def test_device_strings():
    assert ps_task_of("/job:ps/replica:0/task:3/device:CPU:0") == 3
    assert ps_task_of("/job:ps/task:1") == 1  # TF1 replica_device_setter
    assert ps_task_of("/job:worker/replica:0/task:1/device:CPU:0") is None
    assert ps_task_of("") is None


def test_build_groups_parts_and_counts_bytes():
    variables = [
        var("dense/kernel/part_0:0", [3, 4], 0),
        var("dense/kernel/part_1:0", [2, 4], 1),
        var("dense/bias:0", [4], 1),
        var("SGD/iter:0", [], 0, "int64", 8, False),
        var("local:0", [10], None),
    ]
    st = [
        stats(
            100.0,
            "ps:0",
            {"chief:0": (10, 20), "worker:0": (5, 6)},
            [{"t": 0.5, "bytes": {"ps:0|worker:0": [1, 2]}}],
        ),
        stats(100.2, "ps:1", {"worker:0": (7, 8)}),
    ]
    r = report.build(
        {"variables": variables},
        ["10.0.0.1:2223", "10.0.0.2:2223"],
        ["algo-1", "algo-2"],
        st,
        "tf2",
    )
    assert r["schema"] == "shipyard.ps.report/v1" and r["num_shards"] == 2
    kernel = r["placement"][0]
    assert kernel["key"] == "dense/kernel" and kernel["shape"] == [5, 4]
    assert kernel["bytes"] == 80 and kernel["shard"] == [0, 1] and kernel["partitioned"]
    assert [(c["shard"], c["offset"], c["length"]) for c in kernel["chunks"]] == [
        (0, 0, 12),
        (1, 12, 8),
    ]
    assert r["shard_bytes"]["round_robin"] == [48 + 8, 32 + 16]
    assert r["imbalance"]["round_robin"] == round(56 / 52, 4)
    assert r["requested_policy"] == "variable_partitioner"
    assert r["traffic"]["peers"] == ["chief:0", "worker:0"]
    assert r["traffic"]["bytes_to_shard"] == [[10, 0], [5, 7]]
    assert r["traffic"]["bytes_from_shard"] == [[20, 0], [6, 8]]
    assert r["shards"][1]["bytes_in"] == 7 and r["shards"][0]["keys"] == 2
    assert r["local_variables"] == 1 and r["warnings"] == []
    assert r["traffic_timeline"]["points"][0]["bytes_to_shard"] == [[0, 0], [1, 0]]
    assert any("imbalance" in line for line in report.summary_lines(r))


def test_nothing_on_a_ps_warns():
    r = report.build({"variables": [var("w:0", [3], None)]}, ["a:1"], ["algo-1"], [None], "tf2")
    assert r["placement"] == [] and r["warnings"] == [report.NO_PS_WARNING]
    assert r["shards"][0]["answered"] is False
    assert report.build(None, ["a:1"], ["algo-1"], [None], "tf2", script_ok=False)["warnings"] == []


def test_nothing_on_a_ps_says_which_instances_ran_the_script():
    """tf2 layout: only algo-1 runs the script (the coordinator), so no instance but the
    chief trained anything; SageMaker's layout: every instance ran it and trained its own."""
    variables = {"variables": [var("w:0", [3], None)]}
    hosts = ["algo-1", "algo-2"]
    tf2 = report.build(variables, ["a:1", "b:1"], hosts, [None, None], "tf2")["warnings"][0]
    assert "only algo-1 (the chief) ran the script" in tf2
    assert "trained its own copy" not in tf2 and "'layout': 'sagemaker'" in tf2
    sm = report.build(variables, ["a:1", "b:1"], hosts, [None, None], "sagemaker")["warnings"]
    assert "every instance ran the script and trained its own copy" in sm[0]
    assert "only algo-1" not in sm[0]
