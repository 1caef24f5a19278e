"""CPU per ``PSClient.push_pull`` through the in-process transport: the client's own path.

Why: ps_throughput.py times real processes on loopback, which on a shared 2-core machine
mostly measures the neighbours; a refactor of the client (its requests, exchange and data
path) must not make a step dearer, and process CPU time with the shard core in the same
thread (``LocalNetwork``, no sockets) shows that with little noise. Two shards:

* ``pp1k``:  push_pull of one 1 KiB float32 tensor (the one-request path, push_pull_one).
* ``pp5mb``: push_pull of 14 tensors, 4.9 MB in all (sizes like the tutorial CNN's: a few
  large ones sliced over the shards, small ones grouped into PUSH_PULL_MANY), into ``outs``.

Each figure is the median over ``--repeats`` runs of the microseconds of process CPU time
per call. ``--src`` runs another tree's code (a before/after comparison: alternate them).

Run:  python benchmarks/ps_client_cpu.py [--repeats 7] [--src /tmp/base/src]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SIZES = [300_000, 300_000, 200_000, 200_000, 100_000, 50_000, 30_000, 20_000]
SIZES += [10_000, 5_000, 1_000, 500, 100, 10]


def per_call_us(client: Any, grads: dict, outs: dict, calls: int) -> float:
    t = time.process_time()
    for _ in range(calls):
        client.push_pull(grads, outs)
    return (time.process_time() - t) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    args = ap.parse_args()
    sys.path.insert(0, args.src)
    from shipyard.ps.client import PSClient
    from shipyard.ps.core import ServerConfig, ServerCore
    from shipyard.ps.transport import LocalNetwork

    def client(params: dict[str, np.ndarray]) -> Any:
        cores = [ServerCore(ServerConfig(index=i, num_shards=2), "s") for i in range(2)]
        c = PSClient(
            secret="s", heartbeat_interval=0, transport_factory=LocalNetwork(cores).connect
        )
        c.register(params, optimizer={"name": "sgd", "lr": 0.0})
        return c

    small = client({"w": np.zeros(256, np.float32)})
    g1, o1 = {"w": np.ones(256, np.float32)}, {"w": np.empty(256, np.float32)}
    model = {f"t{i}": np.zeros(n, np.float32) for i, n in enumerate(SIZES)}
    large = client(model)
    g5 = {k: np.ones_like(v) for k, v in model.items()}
    o5 = {k: np.empty_like(v) for k, v in model.items()}
    per_call_us(small, g1, o1, 500)  # warm up
    per_call_us(large, g5, o5, 5)
    pp1k = statistics.median(per_call_us(small, g1, o1, 3000) for _ in range(args.repeats))
    pp5mb = statistics.median(per_call_us(large, g5, o5, 40) for _ in range(args.repeats))
    print(f"pp1k  {pp1k:9.1f} us CPU per push_pull")
    print(f"pp5mb {pp5mb:9.0f} us CPU per push_pull")
    print(f"RESULT ps_client_cpu pp1k_us={pp1k:.1f} pp5mb_us={pp5mb:.0f}")


if __name__ == "__main__":
    main()
