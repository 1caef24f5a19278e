"""Counters a shard keeps, and the job-level report built from all shards.

Why: nobody can see where parameter-server variables live or what crosses the
wire (tensorflow#24953, #45291, #51778). Every shard counts what it holds and
what each worker sent and received; a client merges the shards' answers with the
placement into one JSON document that ``shipyard describe`` shows.

Report schema (``REPORT_SCHEMA``, the output of ``PSClient.stats()`` and
``build_report``); all byte counts are wire bytes (headers and MACs included)
except ``bytes``/``shard_bytes``/``placement[].bytes``, which are tensor bytes::

    {
      "schema": "shipyard.ps.report/v1",
      "policy": "greedy_bytes",            # placement policy in use
      "requested_policy": "auto",
      "consistency": {"mode": "async", "max_staleness": null},
      "num_shards": 2,
      "chunk_bytes": 2097152,
      "imbalance": {"round_robin": 1.4, "greedy_bytes": 1.01, "sliced": 1.0},
      "shard_bytes": {"round_robin": [..], "greedy_bytes": [..], "sliced": [..]},
      "placement": [{"key": "conv1.weight", "shape": [32, 3, 3, 3], "dtype": "float32",
                     "bytes": 3456, "shard": [0],
                     "chunks": [{"id": 0, "shard": 0, "offset": 0, "length": 864, "bytes": 3456}]}],
      "shards": [{"shard": 0, "endpoint": "tcp://127.0.0.1:5555", "keys": 4,
                  "bytes": 123456, "optimizer_bytes": 246912,
                  "pushes": 10, "pulls": 10, "updates": 10, "global_step": 5,
                  "bytes_in": 1234, "bytes_out": 1234,
                  "rejected": {"bad_mac": 1}, "live_workers": [0, 1],
                  "uptime_s": 12.5}],
      "traffic": {"workers": [0, 1], "shards": [0, 1],
                  "bytes_to_shard":   [[w0->s0, w0->s1], [w1->s0, w1->s1]],
                  "bytes_from_shard": [[s0->w0, s1->w0], [s0->w1, s1->w1]]},
      "staleness_histogram": {"0": 17, "1": 3},   # updates since the pusher's last pull
      "rejected": {"bad_mac": 1, "unknown_key": 2}, # summed over shards
      # only in the job's final report (``final_report``, written when a job run by the
      # native_ps runner ends; absent from live ``PSClient.stats()`` reports):
      "workers_final": {"0": {"exit_code": 0}, "1": {"lost": "no message for 11s ..."}},
      "warnings": ["parameter_server was enabled but no worker pushed a gradient ..."]
    }

Producers other than shipyard.ps (TensorFlow's parameter servers, issue #3) fill the
same keys; ``placement[].shard`` lists every shard holding part of the key.

A shard's own STATS reply (``ShardStats.to_json``) carries the per-shard entry
plus ``workers`` (per worker: live, progress, bytes_in, bytes_out, pushes, pulls),
``staleness_histogram``, ``keys_detail`` and ``checkpoint``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .consistency import Consistency, WorkerTable
    from .shard import Shard

SCHEMA = "shipyard.ps.report/v1"
REPORT_SCHEMA = __doc__
STALENESS_CAP = 64  # staleness values >= this share one bucket, "64+"


@dataclass
class WorkerTraffic:
    bytes_in: int = 0  # worker -> shard
    bytes_out: int = 0  # shard -> worker
    pushes: int = 0
    pulls: int = 0


@dataclass
class ShardStats:
    """Counters of one shard; updated by the server core, read by STATS requests."""

    started: float = field(default_factory=time.time)
    pushes: int = 0
    pulls: int = 0
    inits: int = 0
    sync_rounds: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    messages_in: int = 0
    messages_out: int = 0
    workers: dict[int, WorkerTraffic] = field(default_factory=dict)
    staleness: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    checkpoints: int = 0
    last_checkpoint: float | None = None

    def worker(self, w: int) -> WorkerTraffic:
        t = self.workers.get(w)
        if t is None:
            t = self.workers[w] = WorkerTraffic()
        return t

    def received(self, worker: int | None, nbytes: int) -> None:
        self.messages_in += 1
        self.bytes_in += nbytes
        if worker is not None:  # a known worker without the call to worker() (every message)
            (self.workers.get(worker) or self.worker(worker)).bytes_in += nbytes

    def sent(self, worker: int | None, nbytes: int) -> None:
        self.messages_out += 1
        self.bytes_out += nbytes
        if worker is not None:
            (self.workers.get(worker) or self.worker(worker)).bytes_out += nbytes

    def reject(self, reason: str) -> None:
        self.rejected[reason] += 1

    def record_staleness(self, value: int) -> None:
        self.staleness[min(max(value, 0), STALENESS_CAP)] += 1

    def staleness_json(self) -> dict[str, int]:
        return {
            (f"{k}+" if k == STALENESS_CAP else str(k)): v
            for k, v in sorted(self.staleness.items())
        }


def shard_json(
    index: int,
    num_shards: int,
    consistency: Consistency,
    shard: Shard,
    stats: ShardStats,
    workers: WorkerTable,
    waiting: Mapping[int, Sized],
    checkpoint: dict[str, Any],
) -> dict[str, Any]:
    """One shard's STATS reply (the per-shard part of the schema above); ``waiting``:
    each worker's queued data requests."""
    s, st = shard, stats
    per_worker = {}
    table = workers.workers
    for w in sorted(set(st.workers) | set(table)):
        t = st.worker(w)
        ws = table.get(w)
        per_worker[str(w)] = {
            "live": bool(ws and ws.live),
            "progress": ws.progress if ws else 0,
            "rejoins": ws.rejoins if ws else 0,
            "bytes_in": t.bytes_in,
            "bytes_out": t.bytes_out,
            "pushes": t.pushes,
            "pulls": t.pulls,
            "waiting": len(waiting.get(w, ())),
        }
    return {
        "shard": index,
        "num_shards": num_shards,
        "consistency": consistency.to_json(),
        "keys": len(s.slots),
        "bytes": s.param_bytes,
        "optimizer_bytes": s.optimizer_bytes,
        "pushes": st.pushes,
        "pulls": st.pulls,
        "inits": st.inits,
        "updates": s.updates,
        "sync_rounds": st.sync_rounds,
        "global_step": s.global_step,
        "bytes_in": st.bytes_in,
        "bytes_out": st.bytes_out,
        "messages_in": st.messages_in,
        "messages_out": st.messages_out,
        "rejected": dict(sorted(st.rejected.items())),
        "live_workers": sorted(workers.live()),
        "workers": per_worker,
        "staleness_histogram": st.staleness_json(),
        "optimizers": {g: o.config() for g, o in s.optimizers.items()},
        "keys_detail": [
            {
                "id": k.key_id,
                "name": k.name,
                "chunk": k.chunk,
                "bytes": k.nbytes,
                "version": k.version,
                "pushes": k.pushes,
                "pulls": k.pulls,
                "initialized": k.initialized,
            }
            for k in sorted(s.slots.values(), key=lambda k: k.key_id)
        ],
        "checkpoint": checkpoint,
        "uptime_s": round(time.time() - st.started, 3),
    }


def build_report(
    placement: Mapping[str, Any] | None,
    shard_stats: Sequence[Mapping[str, Any]],
    endpoints: Sequence[str] | None = None,
    consistency: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge a placement report (``PlacementReport.to_json()``) and shard STATS replies."""
    placement = dict(placement or {})
    shards_out = []
    workers: set[int] = set()
    for s in shard_stats:
        workers.update(int(w) for w in s.get("workers", {}))
    wl = sorted(workers)
    nshards = len(shard_stats)
    to_shard = [[0] * nshards for _ in wl]
    from_shard = [[0] * nshards for _ in wl]
    staleness: Counter = Counter()
    rejected: Counter = Counter()
    for j, s in enumerate(shard_stats):
        entry = {
            k: s.get(k)
            for k in (
                "shard",
                "keys",
                "bytes",
                "optimizer_bytes",
                "pushes",
                "pulls",
                "updates",
                "global_step",
                "bytes_in",
                "bytes_out",
                "rejected",
                "live_workers",
                "uptime_s",
            )
        }
        if endpoints is not None and j < len(endpoints):
            entry["endpoint"] = endpoints[j]
        shards_out.append(entry)
        for w, info in s.get("workers", {}).items():
            i = wl.index(int(w))
            to_shard[i][j] = int(info.get("bytes_in", 0))
            from_shard[i][j] = int(info.get("bytes_out", 0))
        staleness.update({k: int(v) for k, v in s.get("staleness_histogram", {}).items()})
        rejected.update({k: int(v) for k, v in s.get("rejected", {}).items()})
    if consistency is None and shard_stats:
        consistency = shard_stats[0].get("consistency")

    def _order(k: str) -> int:
        return int(k.rstrip("+"))

    return {
        "schema": SCHEMA,
        "policy": placement.get("policy"),
        "requested_policy": placement.get("requested_policy"),
        "consistency": dict(consistency or {}),
        "num_shards": nshards,
        "chunk_bytes": placement.get("chunk_bytes"),
        "imbalance": placement.get("imbalance", {}),
        "shard_bytes": placement.get("shard_bytes", {}),
        "placement": placement.get("placement", []),
        "shards": shards_out,
        "traffic": {
            "workers": wl,
            "shards": list(range(nshards)),
            "bytes_to_shard": to_shard,
            "bytes_from_shard": from_shard,
        },
        "staleness_histogram": {k: staleness[k] for k in sorted(staleness, key=_order)},
        "rejected": dict(sorted(rejected.items())),
    }


NEVER_USED = (
    "parameter_server was enabled but no worker pushed a gradient to the parameter "
    "servers: every process trained its own copy of the model. Wrap the optimizer "
    "(shipyard.ps.torch.DistributedOptimizer, shipyard.ps.keras.DistributedOptimizer) "
    "or use shipyard.ps.PSClient."
)


def final_report(
    answers: Sequence[Mapping[str, Any] | None], endpoints: Sequence[str] | None = None
) -> dict[str, Any]:
    """The job's report from the shards' answers to DONE (``PSClient.finish``): their
    last counters, the placement rank 0 registered, and how each worker ended."""
    present = [a for a in answers if a]
    placement = next((a["placement"] for a in present if a.get("placement")), None)
    report = build_report(placement, [a.get("stats") or {} for a in present], endpoints)
    finished: dict[str, Any] = {}
    for a in present:
        finished.update(a.get("finished") or {})
    report["workers_final"] = dict(sorted(finished.items(), key=lambda kv: int(kv[0])))
    pushes = sum(int((a.get("stats") or {}).get("pushes") or 0) for a in present)
    report["warnings"] = [] if pushes else [NEVER_USED]
    return report
