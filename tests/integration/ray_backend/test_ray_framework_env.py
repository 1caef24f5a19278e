"""Framework environments on Ray (issue 28): the job's first phase resolves the version on
the submitting machine; each node's instance actor builds the same environment the same
way (the same builder, key and lock, under the SHIPYARD_ENVIRONMENTS_DIR the submitter
forwards) before its agent starts, and the job's processes on every node run in it.

The stand-in is data at the resolver's table (as in tests/integration/environments):
"TensorFlow" there is the tiny ``six``; the nodes build it from uv's cache (offline: the
test's nodes have no route to the registry), which the test fills first."""

from __future__ import annotations

import os

import pytest

import shipyard
from shipyard.environments import builder, resolver
from shipyard.environments import job as framework_envs
from tests.integration.environments.test_first_phase import SIX_AS_TENSORFLOW

pytest.importorskip("uv")
pytestmark = [pytest.mark.timeout(400)]

SCRIPT = """
import json, os, sys
import six
print("six", six.__version__, "prefix", sys.prefix, flush=True)
os.makedirs(os.environ["SM_MODEL_DIR"], exist_ok=True)
host = json.loads(os.environ["SM_CURRENT_HOST"]) if os.environ["SM_CURRENT_HOST"].startswith('"') else os.environ["SM_CURRENT_HOST"]
with open(os.path.join(os.environ["SM_MODEL_DIR"], host + ".txt"), "w") as fh:
    fh.write(sys.prefix)
"""


def test_each_node_builds_or_finds_the_same_environment(
    ray_session, ray_cluster, write_script, monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(resolver.FRAMEWORKS, "tensorflow", SIX_AS_TENSORFLOW)
    envs = tmp_path / "envs"
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", str(envs))  # forwarded to the nodes
    # the nodes build with the submitter's uv configuration (the recipe carries UV_*): here
    # offline, from the uv cache this machine's nodes share, since the test's nodes sit on
    # a private network with no route to the registry
    builder.build(  # fills uv's cache with what the nodes need (this process can reach it)
        str(tmp_path / "warm"),
        ("six==1.16.0",),
        builder.RUNTIME_DEPS + builder.pinned_installed(framework_envs.PINNED),
    )
    monkeypatch.setenv("UV_OFFLINE", "1")
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=2,
        instance_type="local",
        framework_version="1.16.0",
        session=ray_session,
    )
    est.fit(job_name="ray-six-env")
    desc = ray_session.control.describe("ray-six-env")
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    assert any(
        t["Status"] == "Downloading"
        and "six==1.16.0" in t["StatusMessage"]
        and "each node builds it" in t["StatusMessage"]
        for t in desc["SecondaryStatusTransitions"]
    )
    out = capsys.readouterr().out
    built = [n for n in os.listdir(envs) if not n.startswith(".")]
    assert len(built) == 1  # two nodes, one cache directory: built once, under one lock
    prefix = str(envs / built[0])
    assert out.count("six 1.16.0 prefix " + prefix) == 2, out
    assert os.path.isfile(os.path.join(prefix, builder.READY))
    assert desc["Shipyard"]["FrameworkEnvironment"]["Version"] == "1.16.0"


def test_a_node_that_cannot_build_it_fails_the_job_naming_the_package(
    ray_session, ray_cluster, write_script, monkeypatch, tmp_path
):
    from shipyard.errors import JobFailedError

    monkeypatch.setitem(resolver.FRAMEWORKS, "tensorflow", SIX_AS_TENSORFLOW)
    envs = tmp_path / "envs"
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", str(envs))
    monkeypatch.setenv("UV_OFFLINE", "1")  # the nodes have no registry: uv's cache lacks it
    write_script("requirements.txt", "shipyard-no-such-package-28==1.0\n")
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=2,
        instance_type="local",
        framework_version="1.16.0",
        session=ray_session,
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="ray-six-bad", logs=False)
    desc = ray_session.control.describe("ray-six-bad")
    reason = desc["FailureReason"]
    assert reason.startswith("ClientError: the framework environment could not be built on a node")
    assert "shipyard-no-such-package-28" in reason and "uv exited with" in reason, reason
    assert not [n for n in os.listdir(envs) if not n.startswith(".")]
