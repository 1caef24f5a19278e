"""A Horovod-style PyTorch script (``import horovod.torch as hvd``), with the inference
functions SageMaker's PyTorch serving container reads from the same file."""

import argparse
import os

import numpy as np
import torch
from torch import nn


def model_fn(model_dir):
    model = nn.Linear(4, 2)
    model.load_state_dict(torch.load(os.path.join(model_dir, "model.pth")))
    return model.eval()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    rng = np.random.default_rng(hvd.rank())
    for _ in range(args.epochs * 5):
        x = torch.tensor(rng.normal(size=(8, 4)), dtype=torch.float32)
        loss = ((model(x) - x[:, :2]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"hvd rank {hvd.rank()} of {hvd.size()} on {os.environ['SM_CURRENT_HOST']}", flush=True)
    if hvd.rank() == 0:
        torch.save(model.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pth"))


if __name__ == "__main__":
    main()
