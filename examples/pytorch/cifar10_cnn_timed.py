"""The tutorials' CIFAR-10 CNN through shipyard.ps, timed: what ``make demo`` measures under
two emulated instance types' networks (and ``shipyard plan`` then extrapolates from).

conv32-conv32-pool-conv64-conv64-pool-dense512-dense10 (the SageMaker Keras tutorial's
model, 1.25 M parameters: 5 MB of gradients per step), in torch, one thread per worker,
random CIFAR-shaped batches (the step's cost does not depend on the pixels). Each worker
times ``--steps`` steps after ``--warmup`` and prints ``step_time=SECONDS``, which the
estimator's ``metric_definitions`` turn into the metric the planner reads.
"""

import argparse
import os
import time

import torch
from torch import nn

import shipyard.ps.torch as ps_torch


def tutorial_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(64 * 6 * 6, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", "--batch_size", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(int(os.environ.get("SHIPYARD_PS_RANK", "0")))
    x = torch.rand(args.batch_size, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch_size,))
    torch.manual_seed(0)
    model = tutorial_cnn()
    opt = ps_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
    )

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    print(f"step_time={(time.perf_counter() - start) / args.steps}", flush=True)
    opt.close()


if __name__ == "__main__":
    main()
