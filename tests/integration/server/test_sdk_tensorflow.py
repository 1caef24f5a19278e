"""The SageMaker tutorial's notebook lines, unmodified, with the real ``sagemaker`` SDK
v2 against a real ``shipyard server``: CIFAR-10-shaped TFRecords uploaded with
``upload_data``, the TensorFlow estimator with ``parameter_server`` on 2 instances,
``fit(logs=True)`` streaming both hosts, then ``deploy``/``predict`` (JSON) and a batch
``transform`` whose predictions equal the SavedModel's own, computed in process."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import tarfile

import numpy as np
import pytest

from tests.integration.server.conftest import EXAMPLES

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
# the notebook's framework_version='2.16' (what the SDK offers) is the installed TensorFlow's
# API generation; this module tests the parameter-server path, deploy and transform on the
# installed TensorFlow, not a TensorFlow 2.16 build (tests/integration/environments builds the
# suite's one framework environment)
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    spec = importlib.util.spec_from_file_location(
        "make_cifar", os.path.join(EXAMPLES, "data", "make_cifar_tfrecords.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("cifar")
    for split, n, seed in (("train", 128, 1), ("eval", 32, 2)):
        os.makedirs(out / split)
        module.write(str(out / split / f"{split}.tfrecords"), n, seed)
    return str(out)


def saved_model_predictions(model_data: str, x: np.ndarray, tmp_path) -> np.ndarray:
    import boto3
    import tensorflow as tf

    bucket, key = model_data[len("s3://") :].split("/", 1)
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        tar.extractall(tmp_path / "model", filter="data")
    loaded = tf.saved_model.load(str(tmp_path / "model" / "1"))
    outputs = loaded.signatures["serving_default"](tf.constant(x))
    return next(iter(outputs.values())).numpy()


def test_parameter_server_fit_deploy_predict_transform(server, cifar, fast_polls, capsys, tmp_path):
    # -- the notebook's own lines ---------------------------------------------------------
    import sagemaker
    from sagemaker.tensorflow import TensorFlow

    sagemaker_session = sagemaker.Session()
    role = sagemaker.get_execution_role()
    bucket = sagemaker_session.default_bucket()
    inputs = sagemaker_session.upload_data(path=cifar, bucket=bucket, key_prefix="data/cifar10")

    estimator = TensorFlow(
        entry_point="cifar10_ps.py",
        source_dir=os.path.join(EXAMPLES, "tensorflow"),
        role=role,
        framework_version="2.16",
        py_version="py310",
        instance_count=2,
        instance_type="ml.c5.xlarge",
        distribution={"parameter_server": {"enabled": True}},
        hyperparameters={"epochs": 1, "steps_per_epoch": 2, "batch_size": 16},
    )
    estimator.fit({"train": inputs + "/train", "eval": inputs + "/eval"}, logs=True)
    # ---------------------------------------------------------------------------------------
    streamed = capsys.readouterr().out
    assert "strategy: ParameterServerStrategyV2" in streamed
    assert "algo-1: finished with status 0" in streamed
    assert "[shipyard-agent] algo-2:" in streamed  # the second host's stream too
    assert "Completed - Training job completed" in streamed
    job = estimator.latest_training_job.name
    assert sagemaker_session.describe_training_job(job)["TrainingJobStatus"] == "Completed"
    assert estimator.model_data.startswith(f"s3://{bucket}/{job}/output/model.tar.gz")
    from shipyard.control.client import ControlPlane  # the same record shipyard shows

    assert ControlPlane(home=server.home).get(job).status == "Completed"

    x = np.random.default_rng(0).integers(0, 255, (3, 32, 32, 3)).astype("float32")
    expected = saved_model_predictions(estimator.model_data, x, tmp_path)

    predictor = estimator.deploy(initial_instance_count=1, instance_type="ml.c5.xlarge")
    try:
        result = predictor.predict(x.tolist())
        np.testing.assert_allclose(np.array(result["predictions"]), expected, atol=1e-4)
    finally:
        predictor.delete_endpoint()

    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r.tolist()) for r in x) + "\n")
    batch = sagemaker_session.upload_data(str(rows), bucket=bucket, key_prefix="transform-in")
    transformer = estimator.transformer(instance_count=1, instance_type="ml.c5.xlarge")
    transformer.transform(batch, content_type="application/json", split_type="Line")
    out_key = transformer.output_path[len(f"s3://{bucket}/") :] + "/rows.jsonl.out"
    import boto3

    body = boto3.client("s3").get_object(Bucket=bucket, Key=out_key)["Body"].read().decode()
    got = [json.loads(line)["predictions"] for line in body.splitlines() if line.strip()]
    np.testing.assert_allclose(np.array(got).reshape(expected.shape), expected, atol=1e-4)
    desc = sagemaker_session.sagemaker_client.describe_transform_job(
        TransformJobName=transformer.latest_transform_job.name
    )
    assert desc["TransformJobStatus"] == "Completed"
