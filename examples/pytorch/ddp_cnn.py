"""The tutorials' CNN trained with PyTorch DDP, in SageMaker's PyTorch script-mode style.

Runs unchanged under ``distribution={"torch_distributed": {"enabled": True}}`` (or
``pytorchddp``, or ``smdistributed.dataparallel`` with ``--backend smddp``) on SageMaker
and on shipyard::

    est = shipyard.PyTorch(entry_point="ddp_cnn.py", source_dir="examples/pytorch",
                           instance_count=2, instance_type="local",
                           distribution={"torch_distributed": {"enabled": True,
                                                               "processes_per_host": 2}})
    est.fit({"training": "file:///tmp/digits"})  # python examples/data/make_digits.py /tmp/digits

Reads SM_CHANNEL_TRAINING (train.npz/test.npz from make_digits.py), SM_MODEL_DIR and the
torchrun variables; ``dist.init_process_group()`` without arguments (gloo on CPU, NCCL
on GPU). Each rank trains on its shard of every epoch's permutation; DDP averages the
gradients. Rank 0 checkpoints every epoch to the checkpoints dir (SageMaker's
/opt/ml/checkpoints, kept across retries) and a restarted job resumes from there;
rank 0 saves model.pth to SM_MODEL_DIR.

The network is the tutorials' Keras CNN (conv32-conv32-pool-conv64-conv64-pool-
dense512-dense10 with dropout), sized for 8x8 digit images.
"""

import argparse
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

OPTIMIZERS = {  # the tutorials' choices
    "adam": lambda params, lr: torch.optim.Adam(params, lr=lr),
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
    "rmsprop": lambda params, lr: torch.optim.RMSprop(params, lr=lr),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument(
        "--batch-size",
        "--batch_size",
        type=int,
        default=32,
        help="per rank, as in SageMaker's DDP examples",
    )
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    parser.add_argument("--learning-rate", "--learning_rate", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backend",
        default=None,
        help="None: torch's default (gloo on CPU, nccl on GPU); 'smddp' needs "
        "import smdistributed.dataparallel.torch.torch_smddp",
    )
    parser.add_argument("--model-dir", "--model_dir", default=os.environ.get("SM_MODEL_DIR"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    parser.add_argument(
        "--checkpoint-dir",
        "--checkpoint_dir",
        default=os.path.join(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"), "checkpoints"),
    )
    parser.add_argument("--num-threads", type=int, default=1)
    return parser.parse_args(argv)


def cnn(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(64 * 2 * 2, 512),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(512, num_classes),
    )


def load(path: str):
    data = np.load(path)  # x: (n, 8, 8, 1) as Keras stores images; torch wants (n, 1, 8, 8)
    x = data["x"]
    return torch.from_numpy(x.reshape(len(x), 1, *x.shape[1:3])), torch.from_numpy(data["y"])


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, "ddp_cnn.pt")


def resume(args, net, opt) -> int:
    """The first epoch to run: rank 0 reads the checkpoint (if any) and every rank gets
    the same state from it, so ranks never disagree about where they resume."""
    state = [None]
    if dist.get_rank() == 0 and os.path.isfile(checkpoint_path(args.checkpoint_dir)):
        state[0] = torch.load(checkpoint_path(args.checkpoint_dir), weights_only=False)
    dist.broadcast_object_list(state, src=0)
    if state[0] is None:
        return 0
    net.load_state_dict(state[0]["model"])
    opt.load_state_dict(state[0]["optimizer"])
    if dist.get_rank() == 0:
        print(
            f"resumed from {checkpoint_path(args.checkpoint_dir)} at epoch {state[0]['epoch'] + 1}",
            flush=True,
        )
    return state[0]["epoch"] + 1


def save_checkpoint(args, net, opt, epoch: int) -> None:
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    path = checkpoint_path(args.checkpoint_dir)
    torch.save(
        {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, path + ".tmp"
    )
    os.replace(path + ".tmp", path)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    if args.backend == "smddp":  # SageMaker's data-parallel library (shipyard: its shim)
        import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    torch.manual_seed(args.seed)
    x, y = load(os.path.join(args.train, "train.npz"))
    net = cnn().to(device)
    opt = OPTIMIZERS[args.optimizer](net.parameters(), args.learning_rate)
    start = resume(args, net, opt)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start, args.epochs):
        model.train()
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed + epoch))
        mine = order[rank::world][: len(y) // world]  # same number of steps on every rank
        total = torch.zeros(2, device=device)
        for i in range(0, len(mine), args.batch_size):
            idx = mine[i : i + args.batch_size]
            xb, yb = x[idx].to(device), y[idx].to(device)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += torch.stack(
                [loss.detach() * len(idx), torch.tensor(float(len(idx)), device=device)]
            )
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch={epoch} train_loss={(total[0] / total[1]).item():.4f}", flush=True)
            save_checkpoint(args, net, opt, epoch)
    model.eval()
    xt, yt = load(os.path.join(args.train, "test.npz"))
    with torch.no_grad():
        accuracy = (net(xt.to(device)).argmax(1).cpu() == yt).float().mean().item()
    if rank == 0:
        print(f"test_accuracy={accuracy:.4f}", flush=True)
        torch.save(net.state_dict(), os.path.join(args.model_dir, "model.pth"))
        with open(os.path.join(args.model_dir, "metrics.json"), "w") as fh:
            json.dump({"test_accuracy": accuracy, "world_size": world}, fh)
        print("saved model.pth to", args.model_dir, flush=True)
    # Inside main(): the DDP module and its process group are gone before interpreter
    # shutdown (alive at finalization, torch 2.13's gloo threads can abort the process).
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
