"""agent.json's sandbox plan is one typed contract (issue 26): written by the control plane
and by each Ray node, read by attribute, refused with the bad field named."""

from __future__ import annotations

import json

import pytest

from shipyard.errors import AgentConfigError, ValidationError
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.config_sandbox import JOB_NETWORK, NODE_NETWORK, OFF, PER_NODE, SandboxPlan
from tests.agent_configs import local_config


def _config_json(sandbox: object) -> str:
    data = json.loads(local_config("/jobs/j/instances", {"algo-1": "10.1.2.1"}).to_json())
    data["sandbox"] = sandbox
    return json.dumps(data)


@pytest.mark.parametrize(
    "plan",
    [
        SandboxPlan(),
        SandboxPlan(JOB_NETWORK, rootless=True, isolation=True, network={"rate": "1gbit"}),
        SandboxPlan(PER_NODE, isolation=True),
        SandboxPlan(NODE_NETWORK, node_address="10.0.0.7", hidden=("/w", "/home/u/.shipyard")),
        SandboxPlan(OFF, reason="the kernel refused namespaces: EPERM", node_address="10.0.0.7"),
    ],
)
def test_every_plan_round_trips_through_agent_json_as_plain_json(plan):
    config = local_config("/jobs/j/instances", {"algo-1": "10.1.2.1"}, sandbox=plan)
    text = config.to_json()
    assert json.loads(text)["sandbox"]["mode"] == plan.mode  # plain JSON, no pickle
    back = AgentConfig.from_json(text)
    assert back.sandbox == plan and isinstance(back.sandbox.hidden, tuple)
    assert back == config


def test_readers_ask_the_plan_what_it_gives():
    assert SandboxPlan(JOB_NETWORK).sandboxed and SandboxPlan(JOB_NETWORK).contained
    node = SandboxPlan(NODE_NETWORK, node_address="10.0.0.7")
    assert not node.sandboxed and node.contained and node.decided_on_node
    for plan in (SandboxPlan(), SandboxPlan(PER_NODE)):
        assert not (plan.sandboxed or plan.contained or plan.decided_on_node)


@pytest.mark.parametrize(
    ("sandbox", "named"),
    [
        ({"enabled": True, "rootless": False}, "sandbox.enabled is not a field"),  # old form
        ({"mode": "namespaces"}, "sandbox.mode is 'namespaces', not one of off, job_network"),
        ({"mode": "off", "rootless": "yes"}, "sandbox.rootless must be true or false"),
        ({"isolation": 1}, "sandbox.isolation must be true or false"),
        ({"reason": 3}, "sandbox.reason must be a string"),
        ({"network": "1gbit"}, "sandbox.network must be a JSON object or null"),
        ({"hidden": "/w"}, "sandbox.hidden must be a list of paths"),
        ({"mode": "node_network"}, "sandbox.node_address is required in mode node_network"),
        (["off"], "sandbox must be a JSON object"),
    ],
)
def test_a_bad_sandbox_plan_is_refused_naming_the_field(sandbox, named):
    with pytest.raises(AgentConfigError) as caught:
        AgentConfig.from_json(_config_json(sandbox))
    assert named in str(caught.value)
    assert "resubmit the job" in str(caught.value)
    assert isinstance(caught.value, ValidationError | ValueError)


def test_a_missing_field_or_broken_json_is_an_agent_config_error():
    data = json.loads(_config_json({}))
    del data["hosts"]
    with pytest.raises(AgentConfigError, match="hosts"):
        AgentConfig.from_json(json.dumps(data))
    with pytest.raises(AgentConfigError, match="not JSON"):
        AgentConfig.from_json("{")


def test_a_ray_nodes_view_also_hides_what_its_plan_names_and_keeps_the_bind_shim(
    tmp_path, monkeypatch
):
    """The agent's view of a Ray instance: fsview's, plus the plan's ``hidden`` masked and
    the bind shim (built in the masked home's cache) kept readable for LD_PRELOAD."""
    from shipyard.agent.__main__ import instance_view
    from shipyard.sandbox import bindshim, fsview

    shim = tmp_path / "cache" / "bindshim-x.so"
    monkeypatch.setattr(bindshim, "build", lambda: bindshim.Shim(str(shim)))
    workdir = tmp_path / "ray-work"
    instances = workdir / "job" / "instances"
    plan = SandboxPlan(NODE_NETWORK, node_address="10.0.0.7", hidden=(str(workdir),))
    config = local_config(str(instances), {"algo-1": "10.0.0.7"}, sandbox=plan)
    view = instance_view(config, fsview.view(config, python=["/srv/venv"]))
    assert str(workdir) in view["mask"]
    assert str(instances) in view["keep_rw"]  # its own trees, bound back by init
    assert str(shim) in view["keep_ro"]
    local = local_config(str(instances), {"algo-1": "10.0.0.7"}, sandbox=SandboxPlan(JOB_NETWORK))
    plain = fsview.view(local, python=["/srv/venv"])
    assert instance_view(local, plain) == plain  # the local backend's view, unchanged


def test_a_path_the_spec_names_does_not_bring_back_what_a_ray_plan_hides(tmp_path, monkeypatch):
    """A job handed the submitter's home (or a directory holding it) through its environment
    must not get it bound back into the private /tmp: hidden wins over named paths, while
    the instance's own tree inside the hidden work dir stays."""
    from shipyard.agent.__main__ import instance_view
    from shipyard.sandbox import bindshim, fsview

    monkeypatch.setattr(bindshim, "build", lambda: bindshim.Shim(None))
    home = tmp_path / "submitter-home"
    (home / "jobs").mkdir(parents=True)
    workdir = tmp_path / "ray-work"
    instances = workdir / "job" / "instances"
    instances.mkdir(parents=True)
    plan = SandboxPlan(NODE_NETWORK, node_address="10.0.0.7", hidden=(str(workdir), str(home)))
    config = local_config(
        str(instances),
        {"algo-1": "10.0.0.7"},
        sandbox=plan,
        environment={"PROBE_HOME": str(home), "PROBE_PARENT": str(tmp_path)},
    )
    view = instance_view(config, fsview.view(config, python=["/srv/venv"]))
    kept = view["keep_rw"] + view["keep_ro"]
    assert str(home) not in kept and str(tmp_path) not in kept
    assert str(home) in view["mask"]
    assert str(instances) in view["keep_rw"]


@pytest.mark.parametrize(
    ("mode", "uri", "mounts"),
    [
        ("FastFile", "s3://bucket/train", True),  # a FUSE mount made after the agent starts
        ("FastFile", "file:///data/train", False),  # a local source is linked, not mounted
        ("File", "s3://bucket/train", False),
        ("Pipe", "s3://bucket/train", False),
    ],
)
def test_the_instance_init_starts_early_unless_a_channel_mounts(monkeypatch, mode, uri, mounts):
    """The init copies the agent's mounts when it starts: it begins while the code is
    staged only where no channel will mount something after that (FastFile from S3)."""
    from shipyard.agent import __main__ as agent
    from shipyard.agent import channels
    from shipyard.sandbox import pidns

    config = local_config(
        "/jobs/j/instances",
        {"algo-1": "10.1.2.1"},
        input_data_config={"train": {"TrainingInputMode": mode}},
        channel_sources={"train": uri},
    )
    assert channels.mounts_anything(config, "algo-1") is mounts
    begun: list[dict] = []
    monkeypatch.setattr(pidns, "begin", lambda view: begun.append(view) or "starting")
    assert agent.early_init(config, "algo-1") == (None if mounts else "starting")
    assert len(begun) == (0 if mounts else 1)
