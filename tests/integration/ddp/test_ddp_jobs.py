"""DDP jobs end to end: real agents, real ranks, real gloo over each job's loopback IPs.

Few jobs, each proving several things: the torchrun environment per rank (byte for
byte), MASTER_PORT moving on when taken, DDP's result (bit-identical ranks, equal to
one process on the combined batch), the SMDDP form running the example unmodified, a
killed rank restarting the job from its checkpoint, a rank that never joins failing
the job by name; and never an orphan.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys

import pytest

import shipyard
from shipyard.errors import JobFailedError
from tests.conftest import job_processes
from tests.lazy import lazy, needs

pytestmark = needs("torch")
torch = lazy("torch")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")
TORCHRUN_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)

# Each rank: dump its torchrun variables, train 5 DDP steps on its quarter of a fixed
# batch of 16, save its parameters.
DDP_SCRIPT = r"""
import json, os, torch, torch.distributed as dist
from torch import nn
keys = KEYS
env = {k: os.environ.get(k) for k in keys}
dist.init_process_group()                    # no arguments: the torchrun contract
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
torch.manual_seed(100 + rank)                # different inits: DDP must broadcast rank 0's
net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
model = nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _ in range(5):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x[rank::world]), y[rank::world]).backward()
    opt.step()
out = os.environ["SM_OUTPUT_DATA_DIR"]
torch.save(net.state_dict(), os.path.join(out, f"rank-{rank}.pt"))
with open(os.path.join(out, f"rank-{rank}.json"), "w") as fh:
    json.dump({"env": env, "backend": str(dist.get_backend())}, fh)
del model, opt  # a DDP module alive at exit can make torch 2.13 gloo abort in finalization
dist.destroy_process_group()
""".replace("KEYS", repr(TORCHRUN_KEYS))


def _instances(desc: dict) -> dict[str, dict]:
    return {i["Host"]: i for i in desc["Shipyard"]["Instances"] if i["Attempt"] == 1}


def _single_process_reference() -> dict[str, torch.Tensor]:
    """The same 5 steps in one process on the whole batch of 16 (rank 0's init)."""
    from torch import nn

    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    torch.manual_seed(100)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.state_dict()


@pytest.mark.timeout(180)
def test_two_by_two_env_contract_taken_port_and_ddp_result(session, write_script):
    two_by_two(session, write_script)


def two_by_two(session, write_script, hold_port=None) -> None:
    """The 2x2 DDP job with its master_port taken: by a wildcard listener of this process,
    and where the instances' machines have port spaces of their own (the Ray test
    cluster's node namespaces) also by ``hold_port(port)``, a context manager."""
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))  # a wildcard listener blocks that port on every IP
    taken.listen(1)
    port = taken.getsockname()[1]
    held = hold_port(port) if hold_port is not None else contextlib.nullcontext()
    src = write_script("train.py", DDP_SCRIPT)
    est = shipyard.PyTorch(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2, "master_port": port}
        },
        session=session,
    )
    try:
        with held:
            est.fit(job_name="ddp-2x2")
    finally:
        taken.close()
    desc = est.latest_training_job.describe()
    job_dir = desc["Shipyard"]["JobDir"]
    master_addr = _instances(desc)["algo-1"]["Address"]
    records, params = {}, {}
    for host, ranks in (("algo-1", (0, 1)), ("algo-2", (2, 3))):
        out = os.path.join(job_dir, "instances", host, "output", "data")
        for r in ranks:
            with open(os.path.join(out, f"rank-{r}.json")) as fh:
                records[r] = json.load(fh)
            params[r] = torch.load(os.path.join(out, f"rank-{r}.pt"))
    with open(os.path.join(job_dir, "logs", "algo-1.log")) as fh:
        moved = re.search(rf"MASTER_PORT {port} is in use on \S+; using (\d+)", fh.read())
    with open(os.path.join(job_dir, "agent.json")) as fh:
        sandboxed = json.load(fh)["sandbox"]["mode"] == "job_network"  # local; not Ray
    if sandboxed:
        # an instance sandbox owns its whole port space: the host's listener takes nothing,
        # and the ranks get the master's name, which libc resolves
        assert moved is None
        used = port
        master_addr = "algo-1"
    else:
        assert moved, "the agent did not report the taken port"
        used = int(moved.group(1))  # the next free one: usually port + 1, but any other
        assert used > port  # process on the machine may hold that one too
    for r in range(4):
        assert records[r]["env"] == {
            "RANK": str(r),
            "LOCAL_RANK": str(r % 2),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(r // 2),
            "GROUP_WORLD_SIZE": "2",
            "ROLE_RANK": str(r),
            "ROLE_WORLD_SIZE": "4",
            "ROLE_NAME": "default",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(used),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "ddp-2x2",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "OMP_NUM_THREADS": "1",
        }, r
    reference = _single_process_reference()
    for name, value in params[0].items():
        for r in (1, 2, 3):
            assert torch.equal(params[r][name], value), (name, r)  # bit-identical
        torch.testing.assert_close(value, reference[name], rtol=1e-5, atol=1e-6)


def _digits(tmp_path) -> str:
    sys.path.insert(0, os.path.join(EXAMPLES, "data"))
    try:
        from make_digits import write_digits
    finally:
        sys.path.pop(0)
    out = tmp_path / "digits"
    write_digits(str(out))
    return str(out)


@pytest.mark.timeout(180)
def test_smddp_example_unmodified_then_killed_rank_resumes_from_checkpoint(session, tmp_path):
    """The example, as an SMDDP script (backend 'smddp'), on 2 x 2 processes. Rank 3 is
    SIGKILLed once, after the first checkpoint: the job restarts every rank, the example
    resumes from the checkpoint and completes; describe keeps both attempts."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(EXAMPLES, "pytorch", "ddp_cnn.py"), src)
    (src / "chaos.py").write_text(CHAOS)
    checkpoints = tmp_path / "checkpoints"
    est = shipyard.PyTorch(
        entry_point="chaos.py",
        source_dir=str(src),
        instance_count=2,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        max_retry_attempts=1,
        checkpoint_local_path=str(checkpoints),
        hyperparameters={"backend": "smddp", "epochs": 3, "checkpoint-dir": str(checkpoints)},
        distribution={
            "smdistributed": {"dataparallel": {"enabled": True, "processes_per_host": 2}}
        },
        session=session,
    )
    est.fit({"training": "file://" + _digits(tmp_path)}, job_name="ddp-retry")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed"
    first, second = desc["Shipyard"]["Attempts"]
    assert "rank 3 (algo-2, local rank 1) failed" in first["failure_reason"]
    assert "SIGKILL" in first["failure_reason"]
    assert not second["failure_reason"]
    job_dir = desc["Shipyard"]["JobDir"]
    with open(os.path.join(job_dir, "logs", "algo-1.attempt2.log")) as fh:
        log = fh.read()
    assert "backend 'smddp' runs as 'gloo'" in log
    assert "resumed from" in log and "epoch=0 " not in log
    with open(os.path.join(job_dir, "instances", "algo-1", "model", "metrics.json")) as fh:
        metrics = json.load(fh)
    assert metrics["world_size"] == 4 and metrics["test_accuracy"] > 0.7
    assert job_processes(job_dir) == []


# Kills its own rank 3 once (first attempt), as soon as a checkpoint exists, then is the
# unmodified example.
CHAOS = r"""
import os, runpy, signal, sys, threading, time
ckpt = os.path.join(sys.argv[sys.argv.index("--checkpoint-dir") + 1], "ddp_cnn.pt")
if os.environ["RANK"] == "3" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    def kill_when_checkpointed():
        while not os.path.exists(ckpt):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=kill_when_checkpointed, daemon=True).start()
sys.argv[0] = "ddp_cnn.py"
runpy.run_path("ddp_cnn.py", run_name="__main__")
"""


@pytest.mark.timeout(120)
def test_rank_that_never_joins_fails_the_job_naming_it(session, write_script):
    src = write_script(
        "train.py",
        """
        import os, time
        if os.environ["RANK"] == "1":
            time.sleep(600)                    # never reaches init_process_group
        import torch.distributed as dist
        dist.init_process_group()
        dist.barrier()
    """,
    )
    est = shipyard.PyTorch(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        distribution={"pytorchddp": {"enabled": True, "rendezvous_timeout": 3}},
        session=session,
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="ddp-nojoin")
    desc = est.latest_training_job.describe()
    reason = desc["FailureReason"]
    assert reason.startswith("[algo-1] rendezvous failed: RendezvousTimeoutError"), reason
    assert "1 of 2 ranks never joined" in reason
    assert "rank 1 (algo-2, local rank 0)" in reason
    assert job_processes(desc["Shipyard"]["JobDir"]) == []


NCCL_ON_CPU = r"""
import torch.distributed as dist
dist.init_process_group(backend="nccl")
"""


@pytest.mark.timeout(120)
def test_nccl_on_an_instance_without_gpu_is_explained(session, write_script):
    """Issue 16 item 5: the reason says the instance has no GPU, not only torch's words.
    One process: the hint is each rank's own (ddp.rank.nccl_hint reads the rank's output),
    so a second rank would only import torch again (~2.5 s of CPU) to fail the same way."""
    src = write_script("nccl.py", NCCL_ON_CPU)
    est = shipyard.PyTorch(
        entry_point="nccl.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        distribution={"torch_distributed": {"enabled": True, "processes_per_host": 1}},
        session=session,
    )
    with pytest.raises(JobFailedError) as err:
        est.fit(job_name="nccl-on-cpu")
    reason = err.value.reason
    assert "backend 'nccl' needs a GPU" in reason, reason
    assert "no GPU" in reason and "gloo" in reason, reason
    assert "NCCL" in reason  # torch's own words stay in the excerpt
    desc = est.latest_training_job.describe()
    assert job_processes(desc["Shipyard"]["JobDir"]) == []
