"""What the server reads from a CreateTrainingJob request: the SDK's ``sagemaker_*``
distribution keys back into ``distribution=`` (the inverse of what shipyard's own SDK
writes), JSON-encoded hyperparameters, and image URIs."""

from __future__ import annotations

import json

import pytest

from shipyard import distribution as dist_mod
from shipyard.server import images
from shipyard.server.errors import ApiError
from shipyard.server.training import decode_hyperparameters, distribution_from

FORMS = [
    None,
    {"parameter_server": {"enabled": True}},
    {"mpi": {"enabled": True, "processes_per_host": 2}},
    {"mpi": {"enabled": True, "processes_per_host": 4, "custom_mpi_options": "-x NCCL_DEBUG"}},
    {"torch_distributed": {"enabled": True}},
    {"pytorchddp": {"enabled": True}},
    {"multi_worker_mirrored_strategy": {"enabled": True}},
    {"smdistributed": {"dataparallel": {"enabled": True}}},
]


@pytest.mark.parametrize("form", FORMS)
def test_distribution_round_trips_through_the_sdk_hyperparameters(form):
    dist = dist_mod.parse(form)
    written = dist_mod.reserved_hyperparameters(dist, "ml.p3.2xlarge")
    encoded = {k: json.dumps(v) for k, v in written.items()}
    back = dist_mod.parse(distribution_from(decode_hyperparameters(encoded)))
    assert back.kind == dist.kind
    for key, value in dist.options.items():
        if key != "enabled":
            assert back.options.get(key) == value


def test_bad_hyperparameters():
    with pytest.raises(ApiError, match="more than one distribution"):
        distribution_from(
            {"sagemaker_mpi_enabled": True, "sagemaker_parameter_server_enabled": True}
        )
    with pytest.raises(ApiError, match="true or false"):
        distribution_from({"sagemaker_mpi_enabled": "yes"})
    assert decode_hyperparameters({"a": '"x"', "b": "3", "c": "not json"}) == {
        "a": "x",
        "b": 3,
        "c": "not json",
    }
    with pytest.raises(ApiError, match="must be a string"):
        decode_hyperparameters({"a": 3})


def test_images():
    uri = "763104351884.dkr.ecr.us-west-2.amazonaws.com/tensorflow-training:2.16.1-cpu-py310"
    assert images.parse(uri, "training") == ("tensorflow", "2.16.1")
    uri = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.3.0-gpu-py311"
    assert images.parse(uri, "inference") == ("pytorch", "2.3.0")
    with pytest.raises(ApiError, match="tensorflow-inference"):
        images.parse(uri.replace("inference", "training"), "inference")
    with pytest.raises(ApiError, match="not one shipyard can run"):
        images.parse("my-registry/custom-algo:latest", "training")


@pytest.mark.parametrize(
    "framework,version,py,scope,expected",
    [
        ("tensorflow", "2.16", "py310", "training", "tensorflow"),
        ("tensorflow", "2.16", None, "inference", "tensorflow"),
        ("pytorch", "2.3", "py311", "training", "pytorch"),
        ("pytorch", "2.3", "py311", "inference", "pytorch"),
    ],
)
def test_the_sdks_own_image_uris(framework, version, py, scope, expected):
    image_uris = pytest.importorskip("sagemaker.image_uris")
    uri = image_uris.retrieve(
        framework,
        region="us-east-1",
        version=version,
        py_version=py,
        instance_type="ml.c5.xlarge",
        image_scope=scope,
    )
    assert images.parse(uri, scope)[0] == expected
