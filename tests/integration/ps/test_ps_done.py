"""Issue 20, defect 3: a shipyard.ps job whose every worker completed must complete.

On a loaded machine a worker's LEAVE can go unanswered (its client gives up after 2 s and
closes) and its wrapper's DONE is sent only once the script's interpreter has exited: the
shards saw the rank silent past the heartbeat timeout, declared both workers lost, exited
with an error, and the job failed with no model.tar.gz. Reproduced deterministically:
each worker drops its client without LEAVE and goes on saving for 3 s, with a 1 s
heartbeat timeout. Before the fix: Failed ("every worker of the job failed ... lost");
now the shards wait for the wrappers' DONE and the job completes.
"""

from __future__ import annotations

import json
import os

import pytest

import shipyard
from tests.lazy import lazy, needs

pytestmark = needs("torch")
torch = lazy("torch")

SCRIPT = """
import os, time
import numpy as np
import torch
import shipyard.ps.torch as ps_torch

rank = int(os.environ["SHIPYARD_PS_RANK"])
net = torch.nn.Linear(4, 3)
opt = ps_torch.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                    named_parameters=net.named_parameters())
x, y = torch.randn(16, 4), torch.randn(16, 3)
while opt.client.step < 5:
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()
print(f"rank={rank} final loss", flush=True)
opt.client.close(leave=False)  # what a LEAVE lost under load leaves the shards with
time.sleep(3)  # saving a big model: silent for 3 heartbeat timeouts
np.savez(os.path.join(os.environ["SM_MODEL_DIR"], f"params-{rank}.npz"),
         **{k: v.detach().numpy() for k, v in net.state_dict().items()})
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_workers_silent_before_their_done_still_complete_the_job(session, write_script):
    est = shipyard.PyTorch(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=2,
        instance_type="local",
        session=session,
        distribution={"parameter_server": {"enabled": True, "heartbeat_timeout": 1}},
    )
    est.fit(job_name="ps-late-done", logs=False)
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    assert desc["ModelArtifacts"]["S3ModelArtifacts"].endswith("model.tar.gz")
    report = desc["Shipyard"].get("DistributionReport") or {}
    finals = report.get("workers_final") or {}
    assert {r: o.get("exit_code") for r, o in finals.items()} == {"0": 0, "1": 0}, json.dumps(
        report
    )[:2000]
    assert os.path.exists(desc["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("file://"))
