"""Horovod (shipyard.horovod) scaling of the tutorials' CIFAR-10 CNN: images/s with
2 ranks x 1 thread vs 1 rank x 1 thread (goal: at least 1.8x).

    .venv/bin/python benchmarks/hvd_scaling.py [--rounds 3] [--steps 20] [--batch 64]

Runs real shipyard jobs with ``distribution={'mpi': ...}`` (1 instance, then 2 instances,
one process each), alternating the two settings round after round so both see the same
machine noise. Each rank runs an unmodified-Horovod-style script (``import horovod.torch as
hvd``, ``hvd.DistributedOptimizer``, ``broadcast_parameters``) that trains the tutorials'
CNN (conv32-conv32-pool-conv64-conv64-pool-dense512-dense10 with dropout, 1.25 M
parameters, 5 MB of gradients per step) on CIFAR-10-shaped random batches (32x32x3,
``--batch`` per rank, weak scaling), times ``--steps`` steps after a warm-up, and the job's
throughput is size x batch x steps / the slowest rank's time. Job start-up is not counted.
Prints each round, the medians and the ratio (ideal 2.0; scaling efficiency = ratio / 2).

Each round also runs the 2-rank job without gradient exchange (``--comm 0``): the machine's
own limit for two processes, and images per CPU-second for all three, which (unlike
images/s) still says what communication costs when other work shares the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

BENCH_SCRIPT = r'''
import argparse, json, os, time
import torch
from torch import nn
import horovod.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int)
p.add_argument("--batch", type=int)
p.add_argument("--comm", type=int, default=1)
args = p.parse_args()
hvd.init()
torch.set_num_threads(1)


def tutorial_cnn():
    """The SageMaker Keras CIFAR-10 tutorial's model, in torch."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(64 * 6 * 6, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))


torch.manual_seed(hvd.rank())
x, y = torch.rand(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
torch.manual_seed(0)
model = tutorial_cnn()
opt = torch.optim.RMSprop(model.parameters(), lr=1e-4 * hvd.size())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
if args.comm:  # --comm 0: the same ranks without gradient exchange (the machine's own limit)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())


def step():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


for _ in range(3):
    step()
hvd.barrier()
start, cpu_start = time.perf_counter(), time.process_time()
for _ in range(args.steps):
    step()
elapsed = hvd.allreduce(torch.tensor([time.perf_counter() - start], dtype=torch.float64), op=hvd.Max)
# CPU seconds of every thread of every rank (compute + communication thread, spinning included)
cpu = hvd.allreduce(torch.tensor([time.process_time() - cpu_start], dtype=torch.float64), op=hvd.Sum)
if hvd.rank() == 0:
    params = sum(p.numel() for p in model.parameters())
    images = hvd.size() * args.batch * args.steps
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "bench.json"), "w") as fh:
        json.dump({"images_per_s": images / elapsed.item(), "images_per_cpu_s": images / cpu.item(),
                   "size": hvd.size(), "params": params}, fh)
'''


def run_job(
    session, src: str, instances: int, steps: int, batch: int, name: str, comm: bool = True
) -> dict:
    import shipyard

    est = shipyard.PyTorch(
        entry_point="bench.py",
        source_dir=src,
        instance_count=instances,
        instance_type="local",
        hyperparameters={"steps": steps, "batch": batch, "comm": int(comm)},
        distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
        environment={"OMP_NUM_THREADS": "1"},
        session=session,
    )
    est.fit(job_name=name, logs=False)
    job_dir = est.latest_training_job.describe()["Shipyard"]["JobDir"]
    with open(os.path.join(job_dir, "instances", "algo-1", "output", "data", "bench.json")) as fh:
        return json.load(fh)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    import shipyard

    home = tempfile.mkdtemp(prefix="hvd-scaling-")
    src = os.path.join(home, "src")
    os.makedirs(src)
    with open(os.path.join(src, "bench.py"), "w") as fh:
        fh.write(BENCH_SCRIPT)
    session = shipyard.Session(home=os.path.join(home, "home"))
    # 1 and 2: ranks with Horovod; 0: two ranks that do not communicate (same processes)
    results: dict[int, list[float]] = {1: [], 2: [], 0: []}
    per_cpu: dict[int, list[float]] = {1: [], 2: [], 0: []}
    label = {1: "1 rank  x 1 thread", 2: "2 ranks x 1 thread", 0: "2 ranks, no communication"}
    params = None
    try:
        for rnd in range(args.rounds):
            order = (1, 2, 0) if rnd % 2 == 0 else (0, 2, 1)
            for n in order:
                out = run_job(
                    session,
                    src,
                    2 if n == 0 else n,
                    args.steps,
                    args.batch,
                    f"hvd-scaling-{rnd}-{n}",
                    comm=n != 0,
                )
                params = out["params"]
                results[n].append(out["images_per_s"])
                per_cpu[n].append(out["images_per_cpu_s"])
                print(
                    f"round {rnd + 1}: {label[n]}: {out['images_per_s']:8.1f} images/s, "
                    f"{out['images_per_cpu_s']:8.1f} images per CPU-second",
                    flush=True,
                )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    one, two = statistics.median(results[1]), statistics.median(results[2])
    ratio = two / one
    print(
        f"\ntutorial CNN ({params / 1e6:.2f} M parameters), batch {args.batch} per rank, "
        f"{args.steps} timed steps, medians of {args.rounds} rounds"
    )
    print(f"1 rank  x 1 thread: {one:8.1f} images/s")
    print(f"2 ranks x 1 thread: {two:8.1f} images/s")
    print(f"ratio {ratio:.2f}x (goal >= 1.8x; scaling efficiency {ratio / 2:.0%})")
    alone = statistics.median(results[0])
    print(
        f"2 ranks without communication: {alone:8.1f} images/s: this machine's own 2-process "
        f"limit is {alone / one:.2f}x; Horovod reaches {two / alone:.0%} of it"
    )
    cpu = {n: statistics.median(v) for n, v in per_cpu.items()}
    print(
        f"images per CPU-second: {cpu[1]:.1f} (1 rank), {cpu[2]:.1f} (2 ranks), {cpu[0]:.1f} (2 ranks, "
        f"no communication): communication costs {cpu[0] / cpu[2]:.2f}x the CPU per image "
        "(unlike images/s this holds on a busy machine)"
    )
    from _result import result

    result("hvd_scaling", one_ips=one, two_ips=two, ratio=ratio, limit_ratio=alone / one)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "images_per_s": results,
                    "images_per_cpu_s": per_cpu,
                    "ratio": ratio,
                    "batch": args.batch,
                    "steps": args.steps,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
