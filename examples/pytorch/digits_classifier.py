"""A PyTorch script-mode classifier for scikit-learn's digits (SageMaker PyTorch style).

Reads its data from SM_CHANNEL_TRAINING (train.npz, test.npz), its settings from
--hyperparameters, and saves to SM_MODEL_DIR -- unchanged from what it would do in a
SageMaker training container. On N instances with no distribution each instance trains
on its own shard of the data (by its index in SM_HOSTS) and algo-1 saves the model.
"""

import argparse
import json
import os

import numpy as np
import torch
from torch import nn


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", "--batch_size", type=int, default=32)
    parser.add_argument("--learning-rate", "--learning_rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", "--model_dir", default=os.environ.get("SM_MODEL_DIR"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    parser.add_argument(
        "--hosts", type=json.loads, default=os.environ.get("SM_HOSTS", '["algo-1"]')
    )
    parser.add_argument("--current-host", default=os.environ.get("SM_CURRENT_HOST", "algo-1"))
    return parser.parse_args()


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train, test = (
        np.load(os.path.join(args.train, "train.npz")),
        np.load(os.path.join(args.train, "test.npz")),
    )
    rank, world = args.hosts.index(args.current_host), len(args.hosts)
    x = torch.from_numpy(train["x"][rank::world]).permute(0, 3, 1, 2)
    y = torch.from_numpy(train["y"][rank::world])
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=args.learning_rate, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        perm = torch.randperm(len(y))
        total = 0.0
        for i in range(0, len(y), args.batch_size):
            idx = perm[i : i + args.batch_size]
            opt.zero_grad()
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        print(f"epoch={epoch} train_loss={total / len(y):.4f}")
    with torch.no_grad():
        xt = torch.from_numpy(test["x"]).permute(0, 3, 1, 2)
        acc = (net(xt).argmax(1).numpy() == test["y"]).mean()
    print(f"test_accuracy={acc:.4f}")
    if args.current_host == args.hosts[0]:
        torch.save(net.state_dict(), os.path.join(args.model_dir, "model.pth"))
        print("saved model.pth to", args.model_dir)


if __name__ == "__main__":
    main()
