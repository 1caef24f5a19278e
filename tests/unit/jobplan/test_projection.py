"""AgentConfig is the plan's projection: agent.json as the JobPlan writes it is byte for
byte what submission wrote before the plan existed.

``agent_json_before.json`` was written by the code before issue 36 (control.plan's
``agent_config(spec, ...)``, commit 039d341) for the specs below with the same inputs;
the secret is pinned, everything else is what the plan derives."""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from pathlib import Path

import pytest

from shipyard.control import plan as control_plan
from shipyard.control.home import Home
from shipyard.control.staging import StagedCode
from shipyard.environments import job as framework_envs
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.config_sandbox import JOB_NETWORK, SandboxPlan
from shipyard.spec import validated
from tests.unit.jobplan.plans import plan_of

BEFORE = json.loads((Path(__file__).parent / "agent_json_before.json").read_text())

TORCH = {"framework": "pytorch", "framework_version": "2.1"}
TF = {"framework": "tensorflow", "framework_version": "2.13"}
CASES = {
    "plain": {"framework": None, "distribution": None},
    "pytorch_plain": dict(TORCH, distribution=None),
    "torch_distributed": dict(
        TORCH,
        distribution={
            "kind": "torch_distributed",
            "options": {"enabled": True, "processes_per_host": 2},
        },
    ),
    "smddp_torch": dict(
        TORCH, distribution={"kind": "smdistributed.dataparallel", "options": {"enabled": True}}
    ),
    "native_ps": dict(
        TORCH,
        distribution={
            "kind": "parameter_server",
            "options": {"enabled": True, "num_shards": 2, "consistency": "sync"},
        },
    ),
    "tf_ps_113": dict(
        TF,
        framework_version="1.13",
        distribution={"kind": "parameter_server", "options": {"enabled": True}},
    ),
    "tf_ps_ports": dict(
        TF,
        distribution={
            "kind": "parameter_server",
            "options": {"enabled": True, "ports": {"ps": 2300}},
        },
    ),
    "mwms": dict(
        TF,
        distribution={
            "kind": "multi_worker_mirrored_strategy",
            "options": {"enabled": True, "port": 9000},
        },
    ),
    "mpi": dict(
        TF,
        distribution={
            "kind": "mpi",
            "options": {"enabled": True, "processes_per_host": 2, "custom_mpi_options": "-x A"},
        },
    ),
}


def spec_of(name: str, case: dict):
    return validated(
        job_name=f"gold-{name.replace('_', '-')}",
        code={"entry_point": "train.py", "source_dir": "/src"},
        instance_count=2,
        instance_type="ml.m5.xlarge",
        hyperparameters={"lr": 0.1},
        environment={"A": "1"},
        **{k: v for k, v in case.items() if v is not None or k == "framework"},
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_agent_json_is_byte_for_byte_what_it_was(name, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setattr(secrets, "token_hex", lambda n=32: "ab" * n)
    home = Home("/tmp/h1gold/home")
    staged = StagedCode(
        "/b/sourcedir.tar.gz", "file:///b/sourcedir.tar.gz", "train.py", False, ["/x"]
    )
    job_plan = replace(
        plan_of(spec_of(name, CASES[name])),
        sandbox=SandboxPlan(JOB_NETWORK, rootless=True),
        framework_env=framework_envs.Prepared("/py", None, None),
    ).with_subnet("10.1.2")
    hps = control_plan.hyperparameters(job_plan, staged, home)
    config = control_plan.agent_config(job_plan, staged, hps, home, {"train": "/data"}, {"K": "v"})
    assert config.to_json() == BEFORE[name]
    # and agent.json reads back to the same typed options the plan holds
    back = AgentConfig.from_json(config.to_json())
    assert back.options().runner == job_plan.runner
    assert back.deciding_hosts() == list(job_plan.deciding_hosts)
