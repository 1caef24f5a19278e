"""s3:// model_data and batch transform input/output through shipyard.storage, against
moto's S3 server on loopback (the channels tests' fixtures)."""

from __future__ import annotations

import numpy as np
import pytest

import shipyard
from tests.integration.channels.conftest import bucket, s3_endpoint  # noqa: F401
from tests.integration.serving.serving_helpers import torchscript_archive

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def test_s3_model_data_and_transform(home, tmp_path, bucket):  # noqa: F811
    import torch

    archive, net = torchscript_archive(str(tmp_path / "m"), features=2, outputs=1)
    with open(archive, "rb") as fh:
        model_uri = bucket.put("models/model.tar.gz", fh.read())
    bucket.put("in/a.csv", b"1,2\n3,4\n")
    bucket.put("in/b/c.csv", b"5,6\n")
    transformer = shipyard.PyTorchModel(model_uri).transformer(
        1, "local", assemble_with="Line", output_path=bucket.uri("out/"), accept="text/csv"
    )
    transformer.transform(bucket.uri("in/"), content_type="text/csv", split_type="Line")
    assert bucket.keys("out/") == ["out/a.csv.out", "out/b/c.csv.out"]
    got = np.asarray(bucket.get("out/a.csv.out").decode().split(), np.float32)
    with torch.no_grad():
        want = net(torch.tensor([[1.0, 2], [3, 4]])).numpy().reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(Exception, match="missing|not found|NoSuchKey|does not exist"):
        shipyard.PyTorchModel(bucket.uri("models/nope.tar.gz")).deploy(endpoint_name="nos3")
