"""The smdistributed shim in a real process with real torch (tests/unit/ddp/test_ddp_contract.py
holds the DDP runner's pure parts and its wire pieces)."""

from __future__ import annotations

import os
import subprocess
import sys

from shipyard.ddp import shim_path
from tests.lazy import needs

pytestmark = needs("torch")

SHIM_SCRIPT = r"""
import os, sys
import smdistributed.dataparallel.torch.torch_smddp
import smdistributed.dataparallel.torch.distributed as sdp
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel
import torch.distributed as dist
store = dist.HashStore()
dist.init_process_group(backend="smddp", store=store, rank=0, world_size=1)
sdp.init_process_group()        # SMDDP's v1 init: a no-op once initialized
print(dist.get_backend(), sdp.get_rank(), sdp.get_world_size(), sdp.get_local_rank(),
      sdp.get_local_size(), DistributedDataParallel.__module__)
dist.destroy_process_group()
"""


def test_smddp_shim_maps_the_backend_and_offers_the_v1_api():
    env = dict(os.environ, PYTHONPATH=shim_path(), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", RANK="0")
    done = subprocess.run(
        [sys.executable, "-c", SHIM_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gloo", "0", "1", "0", "1", "torch.nn.parallel.distributed"]
    assert done.stderr.count("backend 'smddp' runs as 'gloo'") == 1
