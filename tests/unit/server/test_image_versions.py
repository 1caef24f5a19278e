"""An image URI's tag -> the job's framework_version and py_version (issue 28)."""

from __future__ import annotations

import pytest

from shipyard.server import images

ECR = "763104351884.dkr.ecr.us-east-1.amazonaws.com"


@pytest.mark.parametrize(
    ("image", "version", "py"),
    [
        (f"{ECR}/tensorflow-training:2.4.1-cpu-py37", "2.4.1", "py37"),
        (f"{ECR}/pytorch-training:2.3.0-gpu-py311-cu121-ubuntu20.04-sagemaker", "2.3.0", "py311"),
        (f"{ECR}/tensorflow-training:2.16", "2.16", None),
        ("tensorflow-training", None, None),
    ],
)
def test_the_tag_gives_the_version_and_the_python(image, version, py):
    assert images.parse(image, "training")[1] == version
    assert images.py_version(image) == py
