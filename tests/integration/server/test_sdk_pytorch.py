"""The real SDK's PyTorch estimator against ``shipyard server``: ``mpi`` with
``processes_per_host=2`` (a Horovod-style script), deployed and predicted with the
default (NumPy) serializer; ``torch_distributed`` on a GPU instance type, run on this
GPU-less machine on CPU with gloo."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
# the SDK's framework_version='2.3.0' would build a PyTorch 2.3 environment (several hundred
# MB); this module tests the SDK's PyTorch estimator through the server on the installed torch
# (tests/integration/environments builds the suite's one framework environment)
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}
CODE = os.path.join(os.path.dirname(__file__), "torch_code")


def test_mpi_fit_deploy_predict_with_numpy(server, fast_polls, capsys, tmp_path):
    import sagemaker
    from sagemaker.pytorch import PyTorch

    role = sagemaker.get_execution_role()
    estimator = PyTorch(
        entry_point="train_hvd.py",
        source_dir=CODE,
        role=role,
        framework_version="2.3.0",
        py_version="py311",
        instance_count=1,
        instance_type="ml.c5.xlarge",
        distribution={"mpi": {"enabled": True, "processes_per_host": 2}},
        hyperparameters={"epochs": 1},
    )
    estimator.fit(logs=True)
    streamed = capsys.readouterr().out
    assert "hvd rank 0 of 2 on algo-1" in streamed and "hvd rank 1 of 2 on algo-1" in streamed

    import boto3
    import torch

    bucket, key = estimator.model_data[len("s3://") :].split("/", 1)
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        tar.extractall(tmp_path, filter="data")
    model = torch.nn.Linear(4, 2)
    model.load_state_dict(torch.load(tmp_path / "model.pth"))
    x = np.random.default_rng(1).normal(size=(3, 4)).astype("float32")
    expected = model(torch.from_numpy(x)).detach().numpy()

    predictor = estimator.deploy(initial_instance_count=1, instance_type="ml.c5.xlarge")
    try:
        got = predictor.predict(x)  # NumpySerializer / NumpyDeserializer, the defaults
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, expected, atol=1e-5)
    finally:
        predictor.delete_endpoint()


def test_torch_distributed_on_a_gpu_type_runs_on_cpu_with_gloo(server, fast_polls, capsys):
    import sagemaker
    from sagemaker.pytorch import PyTorch

    estimator = PyTorch(
        entry_point="train_ddp.py",
        source_dir=CODE,
        role=sagemaker.get_execution_role(),
        framework_version="2.3.0",
        py_version="py311",
        instance_count=2,
        instance_type="ml.g5.xlarge",
        distribution={"torch_distributed": {"enabled": True}},
    )
    estimator.fit(logs=True)
    streamed = capsys.readouterr().out
    assert "ddp rank 0 of 2 backend gloo on algo-1" in streamed
    assert "ddp rank 1 of 2 backend gloo on algo-2" in streamed
    assert "runs on CPU with gloo" in server.log()


def test_every_file_the_flows_left_in_the_home_is_private(server):
    """After the SDK flows above (S3 uploads, jobs, logs, models, endpoints): the home is
    0700 and nothing in it is open to group or others (server.out is this test's own
    redirect of the server's output, not a file shipyard made)."""
    import stat

    assert stat.S_IMODE(os.stat(server.home).st_mode) == 0o700
    exposed = []
    for top, dirs, files in os.walk(server.home):
        for name in dirs + files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or path == server.log_path:
                continue
            if stat.S_IMODE(st.st_mode) & 0o077:
                exposed.append(f"{os.path.relpath(path, server.home)} {oct(st.st_mode & 0o777)}")
    assert exposed == []
    assert os.listdir(os.path.join(server.home, "s3", "data"))  # the flows did store objects
