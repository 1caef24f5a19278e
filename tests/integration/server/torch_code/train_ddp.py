"""A torchrun-style DDP script: the backend it picks is the one SageMaker scripts pick."""

import os

import torch
import torch.distributed as dist
from torch import nn


def main():
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    print(
        f"ddp rank {dist.get_rank()} of {dist.get_world_size()} backend {dist.get_backend()} "
        f"on {os.environ['SM_CURRENT_HOST']}",
        flush=True,
    )
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pth"))
    # every rank tears gloo down together, as torch's docs ask: a rank destroying its group
    # while rank 0 still saved was once killed by gloo's own SIGABRT ("terminate called
    # without an active exception")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
