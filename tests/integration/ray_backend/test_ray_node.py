"""An instance's files on its node (ray_node): unpacking, config localization, cleanup."""

from __future__ import annotations

import json
import os

from shipyard.backends.ray import node as ray_node


def test_localize_points_the_config_at_the_nodes_copies(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_RAY_WORKDIR", str(tmp_path / "node"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("1\n")
    layout = ray_node.NodeLayout.for_instance("job", "algo-2")
    layout.fresh()
    submit_shared = "/submitter/jobs/job/shared"
    config = {
        "channel_sources": {"train": str(data), "remote": "s3://b/k"},
        "extra_python_path": ["/submitter/cache/req-1"],
        "shared_dir": submit_shared,
        "hyperparameters": {"model_dir": json.dumps(submit_shared + "/model"), "epochs": "3"},
        "instances_dir": "/submitter/jobs/job/instances",
    }
    blobs = {
        "bundle": ray_node.pack_contents(str(data)),
        "channel:train": ray_node.pack_contents(str(data)),
        "pythonpath:0": ray_node.pack_contents(str(data)),
    }
    out = ray_node.localize(config, layout, blobs)
    root = tmp_path / "node" / "job"
    assert out["channel_sources"] == {
        "train": str(root / "stage/algo-2/channels/train"),
        "remote": "s3://b/k",
    }
    assert (root / "stage/algo-2/channels/train/a.csv").read_text() == "1\n"
    assert out["extra_python_path"] == [str(root / "stage/algo-2/pythonpath/0")]
    assert out["hyperparameters"] == {
        "model_dir": json.dumps(str(root / "shared/model")),
        "epochs": "3",
    }
    assert out["instances_dir"] == str(root / "instances")
    assert os.path.isfile(out["submit_directory"])


def test_the_last_instance_to_leave_a_node_removes_the_jobs_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_RAY_WORKDIR", str(tmp_path))
    one, two = (ray_node.NodeLayout.for_instance("job", h) for h in ("algo-1", "algo-2"))
    for layout in (one, two):
        layout.fresh()
        os.makedirs(os.path.join(layout.tree, "model"))
    one.cleanup()
    assert os.path.isdir(two.tree) and not os.path.exists(one.tree)
    two.cleanup()
    assert not os.path.exists(tmp_path / "job")


def test_results_carry_model_output_agent_and_shared(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_RAY_WORKDIR", str(tmp_path / "node"))
    layout = ray_node.NodeLayout.for_instance("job", "algo-1")
    layout.fresh()
    for part in ("model", "output/data", "agent", "code"):
        os.makedirs(os.path.join(layout.tree, part))
    (tmp_path / "node/job/instances/algo-1/model/w.bin").write_bytes(b"w")
    (tmp_path / "node/job/instances/algo-1/output/failure").write_text("boom")
    (tmp_path / "node/job/instances/algo-1/code/train.py").write_text("x")
    ray_node.unpack(layout.results(), str(tmp_path / "home"))
    assert (tmp_path / "home/model/w.bin").read_bytes() == b"w"
    assert (tmp_path / "home/output/failure").read_text() == "boom"
    assert not (tmp_path / "home/code").exists()


def test_the_keeper_puts_the_kernels_verdict_first_in_the_failure(tmp_path, monkeypatch):
    """An instance its node's cgroup ended (memory, processes) fails with that reason, as
    on the local backend, though only the node could read the cgroup."""
    from shipyard.backends.ray.keeper import note_resource_failure

    monkeypatch.setenv("SHIPYARD_RAY_WORKDIR", str(tmp_path))
    layout = ray_node.NodeLayout.for_instance("job", "algo-2")
    layout.fresh()
    note_resource_failure(layout, None)
    failure = os.path.join(layout.tree, "output", "failure")
    assert not os.path.exists(failure)
    note_resource_failure(layout, "OutOfMemoryError: algo-2 exceeded its 8 GiB memory limit")
    with open(failure) as fh:
        assert fh.read() == "OutOfMemoryError: algo-2 exceeded its 8 GiB memory limit"
    with open(failure, "w") as fh:
        fh.write("Killed")
    note_resource_failure(layout, "OutOfMemoryError: algo-2")
    with open(failure) as fh:
        assert fh.read() == "OutOfMemoryError: algo-2\nKilled"


def test_each_nodes_resources_join_the_jobs_record_naming_the_node():
    node = {
        "InstanceType": "ml.m5.large",
        "Cgroups": "v1",
        "Unlimited": None,
        "Fix": None,
        "Instances": {"algo-1": {"Cpus": [0, 1], "MemoryBytes": 8 << 30}},
        "Notes": [],
    }
    job = ray_node.merge_resources(None, node, "algo-1", "10.0.0.12")
    assert job["Instances"] == {
        "algo-1": {"Cpus": [0, 1], "MemoryBytes": 8 << 30, "Node": "10.0.0.12"}
    }
    other = dict(node, Cgroups=None, Unlimited="no cgroup v1 or v2 mounted")
    other["Instances"] = {"algo-2": {"Cpus": None, "MemoryBytes": None}}
    job = ray_node.merge_resources(job, other, "algo-2", "10.0.0.13")
    assert sorted(job["Instances"]) == ["algo-1", "algo-2"]
    assert job["Cgroups"] == "v1"  # the first node's; the other says it in the notes
    assert job["Notes"] == ["algo-2 (node 10.0.0.13): no limits: no cgroup v1 or v2 mounted"]
