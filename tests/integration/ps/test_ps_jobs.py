"""shipyard.ps as a job: the native_ps runner through the SDK, on 2 local instances.

Each test runs real jobs (agents, shard processes, worker wrappers, the user's script);
the training script below is tiny so the jobs take seconds, the examples' CNN runs in
test_ps_examples.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import shipyard
from shipyard.errors import DistributionError, JobFailedError
from tests.lazy import lazy, needs

pytestmark = needs("torch")
torch = lazy("torch")

SCRIPT = """
import argparse, os, signal, sys, time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--kill-rank", type=int, default=-1)
p.add_argument("--kill-at", type=int, default=-1)
p.add_argument("--fail", type=int, default=0)
args = p.parse_args()
if args.fail:  # before torch's import: failing needs none (2-3 s of CPU per worker)
    raise ValueError("the training script failed on purpose")
import numpy as np
import torch
import shipyard.ps.torch as ps_torch
rank, world = int(os.environ["SHIPYARD_PS_RANK"]), int(os.environ["SHIPYARD_PS_NUM_WORKERS"])
torch.manual_seed(0)
net = torch.nn.Linear(4, 3)
rng = np.random.default_rng(0)
x = torch.from_numpy(rng.standard_normal((64, 4)).astype(np.float32))
y = torch.from_numpy(rng.standard_normal((64, 3)).astype(np.float32))
opt = ps_torch.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=net.named_parameters())
print(f"rank={rank} start_step={opt.client.step}", flush=True)
while opt.client.step < args.steps:
    if rank == args.kill_rank and 0 <= args.kill_at <= opt.client.step:
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x[rank::world]), y[rank::world]).backward()
    opt.step()
    time.sleep(args.sleep)
print(f"rank={rank} final_step={opt.client.step}", flush=True)
if rank == 0:
    np.savez(os.path.join(os.environ["SM_MODEL_DIR"], "params.npz"),
             **{k: v.detach().numpy() for k, v in net.state_dict().items()})
opt.close()
"""


def estimator(session, src, hps=None, ps=None, **kw):
    return shipyard.PyTorch(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        hyperparameters=hps or {},
        session=session,
        distribution={"parameter_server": {"enabled": True, **(ps or {})}},
        **kw,
    )


def job_dir(est) -> str:
    return est.latest_training_job.describe()["Shipyard"]["JobDir"]


def model_file(est, name: str) -> str:
    return os.path.join(job_dir(est), "instances", "algo-1", "model", name)


def single_process_sgd(steps: int) -> dict[str, np.ndarray]:
    """What one process training on the combined batch ends with (the sync reference)."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((64, 4)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((64, 3)).astype(np.float32))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        # the mean of the two workers' half-batch losses: the same gradient as the
        # mean over the combined batch (the halves are equal in size)
        loss = sum(torch.nn.functional.mse_loss(net(x[r::2]), y[r::2]) for r in range(2)) / 2
        loss.backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in net.state_dict().items()}


@pytest.mark.timeout(120)
def test_sync_mode_equals_single_process_training_on_the_combined_batch(session, write_script):
    src = write_script("train.py", SCRIPT)
    est = estimator(session, src, {"steps": 12}, {"consistency": "sync", "policy": "sliced"})
    est.fit(logs=False)
    got = np.load(model_file(est, "params.npz"))
    want = single_process_sgd(12)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)
    desc = est.latest_training_job.describe()
    report = desc["Shipyard"]["DistributionReport"]
    assert report["schema"] == "shipyard.ps.report/v1"
    assert report["policy"] == "sliced" and report["consistency"]["mode"] == "sync"
    assert report["workers_final"] == {"0": {"exit_code": 0}, "1": {"exit_code": 0}}
    assert report["traffic"]["workers"] == [0, 1] and all(
        all(b > 0 for b in row) for row in report["traffic"]["bytes_to_shard"]
    )
    assert not desc["Shipyard"]["LostProcesses"]


@pytest.mark.timeout(120)
def test_a_killed_worker_is_recorded_and_the_job_completes(session, write_script):
    src = write_script("train.py", SCRIPT)
    est = estimator(session, src, {"steps": 60, "kill-rank": 1, "kill-at": 5, "sleep": 0.02})
    est.fit(logs=False)
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed"
    lost = desc["Shipyard"]["LostProcesses"]
    assert [(x["host"], x["process"], x["exit_code"]) for x in lost] == [
        ("algo-2", "ps-worker-1", 137)
    ]
    final = desc["Shipyard"]["DistributionReport"]["workers_final"]
    assert final == {"0": {"exit_code": 0}, "1": {"exit_code": 137}}
    assert os.path.isfile(model_file(est, "params.npz"))  # rank 0 trained to the end


@pytest.mark.timeout(90)
def test_every_worker_failing_fails_the_job_with_the_scripts_error(session, write_script):
    src = write_script("train.py", SCRIPT)
    est = estimator(session, src, {"fail": 1})
    with pytest.raises(JobFailedError) as err:
        est.fit(logs=False)
    assert "every worker of the job failed" in str(err.value)
    assert "ValueError: the training script failed on purpose" in str(err.value)


def _kill_shard_once_checkpointed(ckpt_dir: str, deadline: float) -> None:
    """Kill shard 1 (SIGKILL) once it has written a checkpoint."""
    while time.monotonic() < deadline:
        if os.path.isfile(os.path.join(ckpt_dir, "ps-shard-001.json")):
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                if (
                    "shipyard.ps.server" in cmd
                    and ckpt_dir in cmd
                    and "1" == cmd[cmd.index("--shard-index") + 1]
                ):
                    proc.kill()
                    return
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_a_killed_shard_fails_the_job_and_a_rerun_resumes(session, write_script, tmp_path):
    src = write_script("train.py", SCRIPT)
    ckpt = str(tmp_path / "ckpt")
    ps = {"checkpoint_interval": 0.2}
    est = estimator(session, src, {"steps": 400, "sleep": 0.02}, ps, checkpoint_local_path=ckpt)
    killer = threading.Thread(
        target=_kill_shard_once_checkpointed, args=(ckpt, time.monotonic() + 60)
    )
    killer.start()
    with pytest.raises(JobFailedError) as err:
        est.fit(logs=False)
    killer.join()
    assert "parameter-server shard 1 of 2" in str(err.value) and "ended unexpectedly" in str(
        err.value
    )
    assert "checkpoint_local_path" in str(err.value)

    manifest = json.loads((tmp_path / "ckpt" / "ps-shard-000.json").read_text())
    saved = max(int(p) for p in manifest["workers"].values())
    assert 0 < saved < 400
    # the rerun trains a few steps past the checkpoint, not the 400 the first run could not
    # finish (each step a push/pull round trip on both workers: ~3 s of CPU saved a run)
    target = saved + 30
    again = estimator(session, src, {"steps": target}, ps, checkpoint_local_path=ckpt)
    again.fit(logs=False)
    log = Path(job_dir(again), "logs", "algo-1.log").read_text()
    start = int(log.split("rank=0 start_step=")[1].split()[0])
    assert start >= saved * 0.5 and start > 0, log[-2000:]
    assert start < target and f"rank=0 final_step={target}" in log, log[-2000:]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"policy": "nearest"}, "unknown placement policy 'nearest'"),
        ({"consistency": "eventual"}, "unknown consistency mode 'eventual'"),
        ({"max_staleness": -1}, "max_staleness must be >= 0"),
        ({"num_shards": 0}, "'num_shards' must be an integer in [1, 32]"),
        ({"workers_per_host": "2"}, "'workers_per_host' must be an integer"),
        ({"consistancy": "sync"}, "'consistancy' (did you mean 'consistency'?)"),
    ],
)
def test_bad_options_are_refused_at_submission(session, write_script, options, message):
    src = write_script("train.py", SCRIPT)
    with pytest.raises(DistributionError) as err:
        estimator(session, src, ps=options).fit(logs=False)
    assert message in str(err.value)
    assert not os.path.isdir(os.path.join(session.home, "jobs")) or not any(
        os.scandir(os.path.join(session.home, "jobs"))
    )
