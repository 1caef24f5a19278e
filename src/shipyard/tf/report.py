"""The placement and traffic report of a TensorFlow parameter_server job.

Pure: merges what the chief's placement hook recorded (shipyard.tf.placement) with the
relays' counters of every ps (shipyard.runtime.traffic) into the schema shipyard.ps
uses (``shipyard.ps.report/v1``, see shipyard/ps/stats.py), so ``shipyard describe``
shows both kinds of parameter server the same way. Additions for TensorFlow:
``implementation``, ``layout``, ``traffic.peers`` (the name of each row: ``chief:0``,
``worker:1``), ``traffic_timeline``, ``local_variables`` and ``warnings``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

SCHEMA = "shipyard.ps.report/v1"  # shipyard.ps.stats.SCHEMA; kept here so no pyzmq import
_PART = re.compile(r"^(?P<base>.*)/part_(?P<i>\d+)$")
MAX_TIMELINE_POINTS = 300

_NO_PS_FIX = (
    "Create the model and optimizer inside the strategy's scope: strategy = "
    "tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver."
    "TFConfigClusterResolver()); with strategy.scope(): model = ...; model.compile(...) "
    "(TF1-style scripts: build the graph under tf.compat.v1.train.replica_device_setter("
    "cluster=TF_CONFIG's cluster)). Use tf_keras (`import tf_keras` or tf.keras with "
    "TF_USE_LEGACY_KERAS=1): Keras 3 has no ParameterServerStrategy."
)


# TensorFlow 1.x has neither tf.distribute.ParameterServerStrategy nor a Keras `fit` that
# reads TF_CONFIG (the tf-distribution-options notebook's train_ps.py at 1.13)
_NO_PS_FIX_TF1 = (
    "TensorFlow 1.x's Keras fit reads no TF_CONFIG: build the graph under "
    "tf.train.replica_device_setter(cluster=tf.train.ClusterSpec(TF_CONFIG's cluster)) and "
    "train in a tf.train.MonitoredTrainingSession, or make the model an Estimator "
    "(tf.keras.estimator.model_to_estimator) and train it with "
    "tf.estimator.train_and_evaluate, which reads TF_CONFIG."
)


def no_ps_warning(layout: str, chief: str = "algo-1", tensorflow: str | None = None) -> str:
    """Nothing was placed on a ps: who trained what depends on the layout. In the tf2
    layout only the chief runs the script (ParameterServerStrategy's one coordinator; the
    other instances only serve), so it alone trained; in SageMaker's layout every
    instance runs the script, so each trained its own copy."""
    head = "parameter_server was enabled but no variable was placed on a parameter server: "
    if layout == "tf2":
        what = (
            f"only {chief} (the chief) ran the script, as the tf2 layout runs it (the other "
            "instances only serve as workers and parameter servers), and it trained the "
            "model alone; the parameter servers held nothing. A script written to run on "
            "every instance, as SageMaker runs it, can ask for that with "
            "{'parameter_server': {'enabled': True, 'layout': 'sagemaker'}}. "
        )
    else:
        what = (
            "every instance ran the script and trained its own copy of the model; the "
            "parameter servers held nothing. "
        )
    tf1 = bool(tensorflow) and str(tensorflow).split(".")[0] == "1"
    return head + what + (_NO_PS_FIX_TF1 if tf1 else _NO_PS_FIX)


NO_PS_WARNING = no_ps_warning("tf2")  # the default layout's


def _key(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name  # str.removesuffix: 3.9+


def placement_entries(variables: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per logical variable (a partitioned variable's parts become chunks)."""
    entries: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for var in variables:
        if var.get("ps_task") is None:
            continue
        name = _key(var["name"])
        match = _PART.match(name)
        base = match.group("base") if match else name
        if base in entries and not match:  # the same variable seen twice
            continue
        numel = var["bytes"] // max(1, _itemsize(var))
        entry = entries.get(base)
        if entry is None:
            entry = entries[base] = {
                "key": base,
                "shape": list(var["shape"] or []),
                "dtype": var["dtype"],
                "bytes": 0,
                "shard": [],
                "trainable": var.get("trainable", True),
                "partitioned": bool(match),
                "chunks": [],
            }
            order.append(base)
        elif match:  # a further part: the full shape grows along axis 0
            entry["shape"][0] += (var["shape"] or [0])[0]
        offset = sum(c["length"] for c in entry["chunks"])
        entry["chunks"].append(
            {
                "id": len(entry["chunks"]),
                "shard": var["ps_task"],
                "offset": offset,
                "length": numel,
                "bytes": var["bytes"],
            }
        )
        entry["bytes"] += var["bytes"]
        if var["ps_task"] not in entry["shard"]:
            entry["shard"].append(var["ps_task"])
    return [entries[k] for k in order]


def _itemsize(var: Mapping[str, Any]) -> int:
    numel = 1
    for dim in var.get("shape") or []:
        numel *= dim or 0
    return var["bytes"] // numel if numel else 1


def _imbalance(loads: Sequence[int]) -> float | None:
    mean = sum(loads) / len(loads) if loads else 0
    return round(max(loads) / mean, 4) if mean else None


def _timeline(
    stats: Sequence[Mapping[str, Any] | None], relay_of: Sequence[str], peers: list[str]
) -> dict[str, Any]:
    """Cumulative bytes per (peer, ps) over time, merged across the ps processes."""
    samples = []  # (wall time, shard, peer, in, out)
    interval = 1.0
    for j, st in enumerate(stats):
        if not st:
            continue
        timeline = st.get("timeline", {})
        interval = max(interval, float(timeline.get("interval_s", 1.0)))
        for point in timeline.get("points", []):
            for key, (b_in, b_out) in point["bytes"].items():
                relay, _, peer = key.partition("|")
                if relay == relay_of[j] and peer in peers:
                    samples.append((st["started"] + point["t"], j, peer, b_in, b_out))
    if not samples:
        return {"interval_s": interval, "points": []}
    samples.sort()
    t0 = min(st["started"] for st in stats if st)
    nshards = len(stats)
    to = [[0] * nshards for _ in peers]
    frm = [[0] * nshards for _ in peers]
    points: list[dict[str, Any]] = []
    bucket: int | None = None
    for wall, j, peer, b_in, b_out in samples:
        b = int((wall - t0) // interval)
        if bucket is not None and b != bucket:
            points.append(
                {
                    "t": round((bucket + 1) * interval, 3),
                    "bytes_to_shard": [r[:] for r in to],
                    "bytes_from_shard": [r[:] for r in frm],
                }
            )
        bucket = b
        i = peers.index(peer)
        to[i][j], frm[i][j] = b_in, b_out
    assert bucket is not None  # samples is not empty
    points.append(
        {"t": round((bucket + 1) * interval, 3), "bytes_to_shard": to, "bytes_from_shard": frm}
    )
    step = max(1, -(-len(points) // MAX_TIMELINE_POINTS))
    return {"interval_s": interval * step, "points": points[::-1][::step][::-1]}


def build(
    placement: Mapping[str, Any] | None,
    endpoints: Sequence[str],
    hosts: Sequence[str],
    stats: Sequence[Mapping[str, Any] | None],
    layout: str,
    script_ok: bool = True,
) -> dict[str, Any]:
    """The report; ``stats[j]`` is ps j's relay counters (None when it did not answer)."""
    variables = list((placement or {}).get("variables", []))
    entries = placement_entries(variables)
    nshards = len(endpoints)
    loads = [0] * nshards
    keys = [0] * nshards
    for entry in entries:
        for chunk in entry["chunks"]:
            if 0 <= chunk["shard"] < nshards:
                loads[chunk["shard"]] += chunk["bytes"]
                keys[chunk["shard"]] += 1
    relay_of = [f"ps:{j}" for j in range(nshards)]
    peers: list[str] = []
    for j, st in enumerate(stats):
        for peer in (st or {}).get("relays", {}).get(relay_of[j], {}):
            if peer not in peers:
                peers.append(peer)
    peers.sort(key=_peer_order)
    to = [[0] * nshards for _ in peers]
    frm = [[0] * nshards for _ in peers]
    shards = []
    for j, st in enumerate(stats):
        counters = (st or {}).get("relays", {}).get(relay_of[j], {})
        for peer, c in counters.items():
            to[peers.index(peer)][j] = int(c["bytes_in"])
            frm[peers.index(peer)][j] = int(c["bytes_out"])
        shards.append(
            {
                "shard": j,
                "endpoint": endpoints[j],
                "host": hosts[j],
                "keys": keys[j],
                "bytes": loads[j],
                "bytes_in": sum(int(c["bytes_in"]) for c in counters.values()),
                "bytes_out": sum(int(c["bytes_out"]) for c in counters.values()),
                "answered": st is not None,
            }
        )
    policy = "round_robin"
    warnings = []
    local = [v for v in variables if v.get("ps_task") is None]
    if script_ok and not entries:
        chief = hosts[0] if hosts else "algo-1"
        warnings.append(no_ps_warning(layout, chief, (placement or {}).get("tensorflow")))
    return {
        "schema": SCHEMA,
        "implementation": "tensorflow",
        "layout": layout,
        "policy": policy,
        "requested_policy": (
            "variable_partitioner"
            if any(e["partitioned"] for e in entries)
            else "tensorflow default: round-robin by creation order, "
            "optimizer slots next to their variable"
        ),
        "consistency": {"mode": "async", "max_staleness": None},
        "num_shards": nshards,
        "chunk_bytes": None,
        "imbalance": {policy: _imbalance(loads)},
        "shard_bytes": {policy: loads},
        "placement": entries,
        "shards": shards,
        "traffic": {
            "workers": list(range(len(peers))),
            "peers": peers,
            "shards": list(range(nshards)),
            "bytes_to_shard": to,
            "bytes_from_shard": frm,
        },
        "traffic_timeline": _timeline(stats, relay_of, peers),
        "staleness_histogram": {},
        "rejected": {},
        "local_variables": len(local),
        "warnings": warnings,
    }


def _peer_order(name: str) -> tuple[int, str]:
    rank = {"chief": 0, "master": 0, "worker": 1}.get(name.partition(":")[0], 2)
    kind, _, index = name.partition(":")
    return rank, f"{kind}:{int(index):06d}" if index.isdigit() else name


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """A few log lines for the end of the job (describe renders the whole report)."""
    lines = []
    loads = report["shard_bytes"][report["policy"]]
    for shard in report["shards"]:
        lines.append(
            f"ps:{shard['shard']} ({shard['host']}, {shard['endpoint']}): "
            f"{shard['keys']} variables, {shard['bytes']} bytes; wire in "
            f"{shard['bytes_in']} B, out {shard['bytes_out']} B"
        )
    imbalance = report["imbalance"][report["policy"]]
    lines.append(
        f"placement: {len(report['placement'])} variables on {len(loads)} ps, "
        f"imbalance (max/mean bytes) {imbalance}"
    )
    for w in report["warnings"]:
        lines.append("WARNING: " + w)
    return lines
