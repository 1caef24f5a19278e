"""Issue 29 through ``shipyard server``: boto3's CreateTrainingJob ``Tags`` carry the
``shipyard:network`` tag as shipyard's SDK does; a value that does not parse is a
ValidationException naming the fix, and nothing is left."""

from __future__ import annotations

import os

from tests.integration.server.test_boto3 import (  # noqa: F401 (module fixtures)
    refused,
    s3,
    sm,
    staged,
    training_request,
    wait_for,
)

# test_boto3's request names a pytorch 2.3.0 image: run it on the installed torch, as there
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}


def test_network_tag_through_the_sagemaker_api(server, sm, staged):  # noqa: F811
    req = training_request("boto-shaped", staged)
    req["Tags"] = [{"Key": "shipyard:network", "Value": "200mbit"}]
    sm.create_training_job(**req)
    desc = wait_for(sm, "boto-shaped")
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    from shipyard.control.client import ControlPlane

    shown = ControlPlane(home=server.home).describe("boto-shaped")["Shipyard"]["Network"]
    assert shown.startswith("200 Mbit/s")

    bad = training_request("boto-bad-net", staged)
    bad["Tags"] = [{"Key": "shipyard:network", "Value": "fast"}]
    refused(sm, bad, "ValidationException", "'fast' does not parse", "50mbit")
    assert not [d for d in os.listdir(os.path.join(server.home, "jobs")) if "bad-net" in d]
