"""``smdistributed.dataparallel.torch.parallel.distributed.DistributedDataParallel`` is
torch's DistributedDataParallel: the same reducer, over nccl or gloo."""

from torch.nn.parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
