"""``shipyard plan`` as a user runs it (issue 29): a real shipyard.ps job on 2 instances,
then the planner's table, plot and JSON from what it measured; bad input exits 2 with
what is missing and how to get it."""

from __future__ import annotations

import json

import pytest

import shipyard
from tests.integration.test_cli import cli
from tests.lazy import needs

pytestmark = needs("torch")

SCRIPT = """
import os, time
import torch
import shipyard.ps.torch as ps_torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 8))
x, y = torch.randn(64, 256), torch.randn(64, 8)
opt = ps_torch.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01),
                                    named_parameters=net.named_parameters())
start = time.time()
while opt.client.step < 10:
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()
print(f"step_time={(time.time() - start) / 10}", flush=True)
opt.close()
"""


@pytest.fixture(scope="module")
def ps_job(tmp_path_factory):
    """One measured shipyard.ps job (2 instances, torch), run once for the module's tests
    that plan from it (it was run again for each); their ``shipyard plan`` reads it from
    this module's SHIPYARD_HOME."""
    home = tmp_path_factory.mktemp("plan") / "shipyard-home"
    src = tmp_path_factory.mktemp("src")
    (src / "train.py").write_text(SCRIPT)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHIPYARD_HOME", str(home))
        mp.setenv("AWS_REGION", "us-east-1")
        est = shipyard.PyTorch(
            entry_point="train.py",
            source_dir=str(src),
            instance_count=2,
            instance_type="local",
            session=shipyard.Session(home=str(home)),
            distribution={"parameter_server": {"enabled": True}},
            metric_definitions=[{"Name": "step_time", "Regex": "step_time=([0-9.e-]+)"}],
        )
        est.fit(job_name="ps-job", logs=False)
        yield "ps-job"


def test_plan_of_a_measured_parameter_server_job(ps_job):
    res = cli(
        "plan",
        ps_job,
        "--instance-type",
        "ml.p3.16xlarge,10mbit",
        "--instances",
        "1,2,64",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    measured = plan["measured"]
    # the model's two Linear layers: (256x512 + 512 + 512x8 + 8) float32
    assert measured["gradient_bytes"] == 4 * (256 * 512 + 512 + 512 * 8 + 8)
    # the declared metric wins over the step time shipyard measured, and says so
    assert measured["sources"]["step_time"].startswith(
        "the job's step-time metric (wins over shipyard's measured "
    )
    rows = {(r["instance_type"], r["instances"]): r for r in plan["rows"]}
    assert len(rows) == 6
    assert rows[("ml.p3.16xlarge", 1)]["efficiency"] == 1.0
    # at 10 Mbit/s, 64 instances: ps:0 holds the 512 KiB weight, a hot ps
    slow = rows[("10mbit", 64)]
    assert slow["bottleneck"] == "hot ps:0" and "'sliced'" in slow["advice"]
    assert slow["steps_per_s"] < rows[("ml.p3.16xlarge", 64)]["steps_per_s"]
    table = cli("plan", ps_job, "--instance-type", "ml.p3.2xlarge", "--instances", "2,4")
    assert table.returncode == 0, table.stderr
    assert "ml.p3.2xlarge / shipyard_ps: steps per second" in table.stdout
    assert "compute_time: measured here" in table.stdout
    horovod = cli(
        "plan", ps_job, "--instance-type", "10mbit", "--distribution", "horovod", "--json"
    )
    assert {r["distribution"] for r in json.loads(horovod.stdout)["rows"]} == {"horovod"}
    # the same machine, 2 cores: beyond 2 instances the workers wait for each other's CPU
    shared = cli(
        "plan", ps_job, "--instance-type", "ml.p3dn.24xlarge", "--instances", "2,4",
        "--shared-host", "2", "--json",
    )  # fmt: skip
    assert shared.returncode == 0, shared.stderr
    by_n = {r["instances"]: r for r in json.loads(shared.stdout)["rows"]}
    assert by_n[4]["bottleneck"] == "host CPU", by_n
    assert "4 workers share this machine's 2 cores" in by_n[4]["advice"]
    assert by_n[2]["bottleneck"] != "host CPU"


BAD = [
    (["--instance-type", "ml.zz.xlarge"], "'ml.zz.xlarge': its network bandwidth is not known"),
    (["--instance-type", "fast"], "'fast' does not parse"),
    (["--instance-type", "local"], "has no rated network"),
    (["--instances", "2,x"], "--instances '2,x'"),
    (["--distribution", "ring"], "--distribution 'ring' is not known"),
    (["--shared-host", "0"], "--shared-host 0: give this machine's core count"),
]


def test_bad_plan_input_exits_2(ps_job):
    for args, message in BAD:  # one measured job for every case: it takes seconds to run
        res = cli("plan", ps_job, *args)
        assert res.returncode == 2, (args, res.stdout + res.stderr)
        assert message in " ".join((res.stdout + res.stderr).split()), args


def test_a_job_that_measured_nothing_exits_2_with_how_to_measure(session, write_script):
    src = write_script("train.py", "print('no distribution, no metric')\n")
    shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    ).fit(job_name="plain", logs=False)
    res = cli("plan", "plain", "--instance-type", "ml.p3.16xlarge")
    assert res.returncode == 2
    assert "--gradient-bytes" in " ".join(res.stderr.split() + res.stdout.split())
    missing = cli("plan", "no-such-job", "--instance-type", "ml.p3.16xlarge")
    assert missing.returncode == 3
