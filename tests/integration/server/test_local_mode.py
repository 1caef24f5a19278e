"""SageMaker local mode with the real SDK and no Docker: ``instance_type='local'`` in an
unmodified notebook's cells trains (2 instances, ``mpi``), deploys, predicts and deletes on
shipyard, through nothing but the environment ``shipyard server env`` prints (its ``docker``
stand-ins first on PATH). The job is shipyard's (``shipyard jobs`` lists it); what cannot be
mapped is refused, naming it."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(400)]
# the SDK's framework_version='2.3.0' would build a PyTorch 2.3 environment (several hundred
# MB); this module tests local mode without Docker on the installed torch
# (tests/integration/environments builds the suite's one framework environment)
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}
CODE = os.path.join(os.path.dirname(__file__), "torch_code")


def test_docker_on_path_is_shipyards_stand_in(server) -> None:
    docker = shutil.which("docker")
    assert docker is not None and docker.startswith(server.home)
    version = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=True
    )
    assert "v2" in version.stdout and "shipyard" in version.stdout  # what the SDK checks
    info = subprocess.run(["docker", "info"], capture_output=True, text=True)
    assert info.returncode != 0 and "shipyard" in info.stderr


def test_local_mode_trains_deploys_predicts_and_deletes(
    server, fast_polls, capsys, tmp_path
) -> None:
    # fast_polls: deploy's wait_for_endpoint sleeps its 30 s poll before its first
    # DescribeEndpoint, even in local mode, where the endpoint is InService once create
    # returns (the SDK pinged it itself, sagemaker.local.entities' own 5 s loop, unchanged)
    import sagemaker
    from sagemaker.pytorch import PyTorch

    estimator = PyTorch(
        entry_point="train_hvd.py",
        source_dir=CODE,
        role=sagemaker.get_execution_role(),
        framework_version="2.3.0",
        py_version="py311",
        instance_count=2,
        instance_type="local",
        distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
        hyperparameters={"epochs": 1},
    )
    estimator.fit(logs=True)
    streamed = capsys.readouterr().out
    assert "hvd rank 0 of 2 on algo-1" in streamed
    assert "hvd rank 1 of 2 on algo-2" in streamed
    job = estimator.latest_training_job.name

    from shipyard.control.client import ControlPlane

    record = ControlPlane(home=server.home).store.get(job)
    assert record.status.value == "Completed"  # shipyard ran it, on its own instances

    # the SDK packed model.tar.gz from what the stand-in left in its model directory
    import boto3
    import torch

    assert estimator.model_data.startswith("s3://")
    bucket, key = estimator.model_data[len("s3://") :].split("/", 1)
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        tar.extractall(tmp_path, filter="data")
    model = torch.nn.Linear(4, 2)
    model.load_state_dict(torch.load(tmp_path / "model.pth"))
    x = np.random.default_rng(2).normal(size=(3, 4)).astype("float32")
    expected = model(torch.from_numpy(x)).detach().numpy()

    predictor = estimator.deploy(initial_instance_count=1, instance_type="local")
    try:
        got = predictor.predict(x)
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)
    finally:
        predictor.delete_endpoint()
    from shipyard.control.endpoints import Endpoints

    assert Endpoints(home=server.home).list() == []  # deleted with the SDK's endpoint


def test_an_image_shipyard_cannot_run_is_refused_by_name(server, tmp_path) -> None:
    """A compose file naming an image that is not a SageMaker framework image: `up` fails
    and says which image and what is supported."""
    host = tmp_path / "algo-1-abcde"
    (host / "input" / "config").mkdir(parents=True)
    (host / "input" / "config" / "hyperparameters.json").write_text(
        json.dumps({"sagemaker_program": json.dumps("train.py")})
    )
    compose = tmp_path / "docker-compose.yaml"
    compose.write_text(
        json.dumps(  # JSON is YAML
            {
                "services": {
                    "algo-1-abcde": {
                        "image": "123.dkr.ecr.us-east-1.amazonaws.com/my-own-image:1",
                        "command": "train",
                        "volumes": [f"{host / 'input'}:/opt/ml/input"],
                        "environment": [],
                    }
                }
            }
        )
    )
    done = subprocess.run(
        ["docker", "compose", "-f", str(compose), "up", "--build", "--abort-on-container-exit"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "my-own-image" in done.stdout and "tensorflow-training" in done.stdout


def test_a_processing_container_is_refused(tmp_path) -> None:
    from shipyard.server.compose.project import ComposeError, project

    with pytest.raises(ComposeError, match="processing jobs"):
        project({"services": {"algo-1-x": {"image": "i", "entrypoint": ["python3", "p.py"]}}})


def test_stand_in_runs_with_this_python(server) -> None:
    text = open(shutil.which("docker")).read()
    assert sys.executable in text and "shipyard.server.compose docker" in text
