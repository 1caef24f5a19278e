"""The SageMaker SDK's local-mode compose file, read: volumes (SELinux ``:z`` suffix
included), channels, nested container paths, GPUs, host order, and refusals that name what
cannot be mapped."""

from __future__ import annotations

import pytest

from shipyard.server.compose.project import ComposeError, project


def _svc(**over):
    base = {
        "image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-cpu-py311",
        "command": "train",
        "volumes": [
            "/tmp/r/algo-1-a/input:/opt/ml/input",
            "/tmp/r/model:/opt/ml/model:z",
            "/data/train:/opt/ml/input/data/training",
            "/src:/opt/ml/code",
        ],
        "environment": ["AWS_REGION=us-east-1", "TRAINING_JOB_NAME=j", "EMPTY="],
    }
    base.update(over)
    return base


def test_a_training_service_is_read() -> None:
    p = project({"services": {"algo-1-a": _svc()}})
    s = p.first
    assert p.command == "train" and s.name == "algo-1-a"
    assert s.host_dir("/opt/ml/model") == "/tmp/r/model"  # `:z` dropped
    assert s.channels == {"training": "/data/train"}
    assert s.environment == {"AWS_REGION": "us-east-1", "TRAINING_JOB_NAME": "j", "EMPTY": ""}
    assert not s.gpu


def test_nested_container_paths_map_through_the_deepest_volume() -> None:
    s = project({"services": {"algo-1-a": _svc()}}).first
    assert s.host_path("/opt/ml/model/code") == "/tmp/r/model/code"
    assert s.host_path("/opt/ml/input/data/training/x.csv") == "/data/train/x.csv"
    assert s.host_path("/opt/ml/modelx") is None
    assert s.host_path("/etc/passwd") is None


def test_hosts_in_numeric_order_and_gpu_reservation() -> None:
    gpu = {"resources": {"reservations": {"devices": [{"count": "all", "capabilities": ["gpu"]}]}}}
    services = {f"algo-{k}-x": _svc(deploy=gpu) for k in (10, 2, 1)}
    p = project({"services": services})
    assert [s.name for s in p.services] == ["algo-1-x", "algo-2-x", "algo-10-x"]
    assert all(s.gpu for s in p.services)


def test_serving_ports() -> None:
    p = project({"services": {"algo-1-a": _svc(command="serve", ports=["8081:8080"])}})
    assert p.first.ports == [(8081, 8080)]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"entrypoint": ["python", "p.py"]}, "processing jobs"),
        ({"command": "bash"}, "`train` and `serve`"),
        ({"image": ""}, "names no image"),
        ({"volumes": ["no-colon"]}, "HOST:CONTAINER"),
        ({"ports": ["a:b"]}, "port mapping"),
        ({"environment": ["NOEQUALS"]}, "KEY=VALUE"),
    ],
)
def test_what_cannot_be_mapped_is_refused_by_name(change, message) -> None:
    with pytest.raises(ComposeError, match=message):
        project({"services": {"algo-1-a": _svc(**change)}})


def test_mixed_or_empty_projects_are_refused() -> None:
    with pytest.raises(ComposeError, match="no services"):
        project({"version": "2.3"})
    with pytest.raises(ComposeError, match="mixes"):
        project({"services": {"algo-1-a": _svc(), "algo-2-a": _svc(command="serve")}})
    with pytest.raises(ComposeError, match="one container"):
        project({"services": {k: _svc(command="serve") for k in ("algo-1-a", "algo-2-a")}})
