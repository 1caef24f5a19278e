"""``smdistributed.dataparallel.torch.parallel``: DistributedDataParallel (torch's)."""

from smdistributed.dataparallel.torch.parallel.distributed import (
    DistributedDataParallel,
)

__all__ = ["DistributedDataParallel"]
