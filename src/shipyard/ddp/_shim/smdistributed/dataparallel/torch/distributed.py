"""``smdistributed.dataparallel.torch.distributed``: SMDDP's v1 API on torch.distributed.

Older SMDDP scripts use this module instead of ``torch.distributed``::

    import smdistributed.dataparallel.torch.distributed as dist
    dist.init_process_group()
    rank, size, local_rank = dist.get_rank(), dist.get_world_size(), dist.get_local_rank()

Everything torch.distributed offers is re-exported; the SMDDP-only names are added:
``get_local_rank``, ``get_local_size``/``get_local_world_size``, ``get_node_rank``,
``get_node_count``. ``init_process_group()`` defaults to the smddp backend (nccl or gloo).
"""

from __future__ import annotations

import os

import torch.distributed as _dist
from smdistributed.dataparallel.torch import torch_smddp as _smddp
from torch.distributed import *
from torch.distributed import is_initialized


def init_process_group(backend: str = _smddp.SMDDP, *args, **kwargs):  # type: ignore[no-redef]
    """SMDDP's init: the smddp backend unless told otherwise; a no-op when done already."""
    if is_initialized():
        return None
    return _dist.init_process_group(backend, *args, **kwargs)


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


get_local_world_size = get_local_size


def get_node_rank() -> int:
    return int(os.environ.get("GROUP_RANK", "0"))


def get_node_count() -> int:
    return int(os.environ.get("GROUP_WORLD_SIZE", "1"))
