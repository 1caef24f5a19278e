"""The tutorials' CNN trained asynchronously through shipyard.ps (a parameter server for PyTorch).

Runs under ``distribution={"parameter_server": {"enabled": True}}`` with the PyTorch
estimator (shipyard's native parameter server: one shard and one worker per instance
by default)::

    est = shipyard.PyTorch(entry_point="ps_cnn.py", source_dir="examples/pytorch",
                           instance_count=2, instance_type="local",
                           distribution={"parameter_server": {"enabled": True}})
    est.fit({"training": "file:///tmp/digits"})  # python examples/data/make_digits.py /tmp/digits

Two lines differ from single-process training: the optimizer is wrapped in
``shipyard.ps.torch.DistributedOptimizer`` (gradients go to the shards as backward
produces them, the shards run Adam, fresh parameters come back before the next
forward) and each worker reads its own shard of the data (SHIPYARD_PS_RANK of
SHIPYARD_PS_NUM_WORKERS). The shards checkpoint to the checkpoints dir; a job run
again with the same checkpoint_local_path resumes at the step it reached.

The network and data loading are ddp_cnn.py's (the tutorials' Keras CNN sized for 8x8
digits): the same model trained by DDP and by the parameter server.
"""

import argparse
import json
import os

import torch
from ddp_cnn import cnn, load
from torch import nn

import shipyard.ps.torch as ps_torch


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", "--batch_size", type=int, default=32)
    parser.add_argument("--learning-rate", "--learning_rate", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", "--model_dir", default=os.environ.get("SM_MODEL_DIR"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rank = int(os.environ.get("SHIPYARD_PS_RANK", "0"))
    world = int(os.environ.get("SHIPYARD_PS_NUM_WORKERS", "1"))
    x, y = load(os.path.join(args.train, "train.npz"))
    net = cnn()
    opt = torch.optim.Adam(net.parameters(), lr=args.learning_rate)
    opt = ps_torch.DistributedOptimizer(opt, named_parameters=net.named_parameters())
    steps_per_epoch = -(-len(y) // world // args.batch_size)
    start = opt.client.step // steps_per_epoch  # > 0 when the shards resumed from a checkpoint
    if start:
        print(f"resumed at step {opt.client.step} (epoch {start})", flush=True)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start, args.epochs):
        net.train()
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed + epoch))
        mine = order[rank::world]
        total = 0.0
        for i in range(0, len(mine), args.batch_size):
            idx = mine[i : i + args.batch_size]
            opt.zero_grad()
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        print(
            f"epoch={epoch} step={opt.client.step} train_loss={total / len(mine):.4f}", flush=True
        )
    net.eval()
    xt, yt = load(os.path.join(args.train, "test.npz"))
    with torch.no_grad():
        accuracy = (net(xt).argmax(1) == yt).float().mean().item()
    if rank == 0:  # the model it saves is the job's: its accuracy is the job's metric
        print(f"test_accuracy={accuracy:.4f}", flush=True)
        torch.save(net.state_dict(), os.path.join(args.model_dir, "model.pth"))
        with open(os.path.join(args.model_dir, "metrics.json"), "w") as fh:
            json.dump({"test_accuracy": accuracy, "workers": world, "steps": opt.client.step}, fh)
    else:
        print(f"rank={rank} accuracy={accuracy:.4f} (parameters as of its last step)", flush=True)
    opt.close()


if __name__ == "__main__":
    main()
