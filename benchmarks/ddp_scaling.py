"""DDP scaling of the example CNN: images/s with 2 processes x 1 thread vs 1 x 1.

    .venv/bin/python benchmarks/ddp_scaling.py [--rounds 3] [--steps 60] [--batch 64]

Runs real shipyard jobs (torch_distributed, one instance, processes_per_host 1 and 2),
alternating the two settings round after round so both see the same machine noise.
Inside each job every rank trains examples/pytorch/ddp_cnn.py's CNN on digit-shaped
batches (8x8x1, ``--batch`` per rank), times ``--steps`` steps after a warm-up, and the
job's throughput is world x batch x steps / the slowest rank's time. Job start-up is
not counted. Prints each round, the medians and the ratio (ideal: 2.0; scaling
efficiency = ratio / 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "pytorch", "ddp_cnn.py")

BENCH_SCRIPT = r"""
import argparse, json, os, time
import torch, torch.distributed as dist
from torch import nn
from ddp_cnn import cnn
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int); p.add_argument("--batch", type=int)
args = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
x, y = torch.rand(args.batch, 1, 8, 8), torch.randint(0, 10, (args.batch,))
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(cnn())
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
def step():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
for _ in range(10):
    step()
dist.barrier()
start = time.perf_counter()
for _ in range(args.steps):
    step()
elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
if rank == 0:
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "bench.json"), "w") as fh:
        json.dump({"images_per_s": world * args.batch * args.steps / elapsed.item(),
                   "world": world}, fh)
# A DDP module alive at interpreter exit keeps its gloo group (and worker threads) alive
# into finalization, where torch 2.13 can abort ("terminate called without an active
# exception"): drop it, then destroy the group.
del model, opt
dist.destroy_process_group()
"""


def run_job(session, src: str, nproc: int, steps: int, batch: int, name: str) -> float:
    import shipyard

    est = shipyard.PyTorch(
        entry_point="bench.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        hyperparameters={"steps": steps, "batch": batch},
        distribution={"torch_distributed": {"enabled": True, "processes_per_host": nproc}},
        session=session,
    )
    est.fit(job_name=name, logs=False)
    job_dir = est.latest_training_job.describe()["Shipyard"]["JobDir"]
    with open(os.path.join(job_dir, "instances", "algo-1", "output", "data", "bench.json")) as fh:
        return json.load(fh)["images_per_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    import shipyard

    work = tempfile.mkdtemp(prefix="ddp-scaling-")
    try:
        src = os.path.join(work, "src")
        os.makedirs(src)
        shutil.copy(EXAMPLE, src)
        with open(os.path.join(src, "bench.py"), "w") as fh:
            fh.write(BENCH_SCRIPT)
        session = shipyard.Session(home=os.path.join(work, "home"))
        results: dict[int, list[float]] = {1: [], 2: []}
        for r in range(args.rounds):
            for nproc in (1, 2):
                ips = run_job(session, src, nproc, args.steps, args.batch, f"scale-{r}-{nproc}")
                results[nproc].append(ips)
                print(f"round {r}: {nproc} process(es) x 1 thread: {ips:8.0f} images/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    one, two = statistics.median(results[1]), statistics.median(results[2])
    print(
        f"median 1 x 1: {one:.0f} images/s; 2 x 1: {two:.0f} images/s; "
        f"ratio {two / one:.2f} (scaling efficiency {two / one / 2:.0%}); "
        f"batch {args.batch}/rank, {args.steps} timed steps, {os.cpu_count()} CPUs"
    )
    from _result import result

    result("ddp_scaling", one_ips=one, two_ips=two, ratio=two / one)
    return 0


if __name__ == "__main__":
    sys.exit(main())
