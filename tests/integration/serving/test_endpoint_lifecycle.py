"""Endpoints as processes: they outlive their creator, are listed and deleted from the
CLI leaving nothing behind, and bad input (port in use, missing or unsafe model data, a
model that fails to load) is refused or reported with nothing left running."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
import urllib.request

import numpy as np
import pytest

import shipyard
from shipyard.control.endpoints import EndpointError, Endpoints
from shipyard.errors import ValidationError
from tests.integration.serving.serving_helpers import (
    server_processes,
    torchscript_archive,
)

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _nothing_left(home, name: str) -> None:
    edir = os.path.join(str(home), "endpoints", name)
    assert not os.path.exists(edir)
    assert server_processes(edir) == []
    assert name not in [r.name for r in Endpoints(str(home)).list()]


def test_endpoint_outlives_its_creator_and_cli_deletes_it(home, tmp_path):
    archive, net = torchscript_archive(str(tmp_path / "m"))
    script = textwrap.dedent(f"""
        import shipyard
        p = shipyard.PyTorchModel({archive!r}).deploy(1, "local", endpoint_name="survivor")
        print(p.endpoint_name)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    # the creator is gone; the endpoint still answers
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = shipyard.PyTorchPredictor("survivor").predict(x)
    np.testing.assert_allclose(
        got, net(__import__("torch").from_numpy(x)).detach().numpy(), rtol=1e-6
    )
    cli = [sys.executable, "-m", "shipyard.cli"]
    listed = subprocess.run(
        cli + ["endpoints", "--json"], capture_output=True, text=True, check=False
    )
    (record,) = json.loads(listed.stdout)
    assert record["EndpointName"] == "survivor" and record["EndpointStatus"] == "InService"
    workers = server_processes(os.path.join(str(home), "endpoints", "survivor"))
    assert len(workers) == 2  # master + one worker
    deleted = subprocess.run(
        cli + ["endpoints", "delete", "survivor"], capture_output=True, text=True, check=False
    )
    assert deleted.returncode == 0, deleted.stderr
    _nothing_left(home, "survivor")
    missing = subprocess.run(
        cli + ["endpoints", "delete", "survivor"], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 3 and "no endpoint named 'survivor'" in missing.stderr


# loading takes a while, as a real model's does: a replacement worker must not take
# requests before its model is loaded (CI once saw a 500 from one that did)
SLOW_MODEL_FN = """
import os, time
import torch

def model_fn(model_dir):
    time.sleep(2)
    return torch.jit.load(os.path.join(model_dir, "model.pt"))
"""


def test_cli_serve_detached_with_workers(home, tmp_path):
    archive, _ = torchscript_archive(
        str(tmp_path / "m"), extra={"code/inference.py": SLOW_MODEL_FN}
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shipyard.cli",
            "serve",
            archive,
            "--port",
            "0",
            "--workers",
            "2",
            "--name",
            "cli-ep",
            "--detach",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    record = Endpoints(str(home)).get("cli-ep")
    req = urllib.request.Request(
        record.url + "/invocations",
        data=b"[[1,2,3,4]]",
        headers={"Content-Type": "application/json"},
    )
    assert len(json.loads(urllib.request.urlopen(req).read())[0]) == 3
    procs = server_processes(record.endpoint_dir)
    assert len(procs) == 3  # master + two workers
    # a worker that dies is replaced; the endpoint keeps answering
    worker = next(p for p in procs if "shipyard.serving.worker" in " ".join(p.cmdline()))
    worker.kill()
    worker.wait(10)
    # every request while the replacement starts and loads is answered by the live one
    deadline = time.monotonic() + 120
    answered = 0
    while time.monotonic() < deadline:
        assert len(json.loads(urllib.request.urlopen(req).read())[0]) == 3
        answered += 1
        if len(server_processes(record.endpoint_dir)) == 3 and answered >= 40:
            break
    assert len(server_processes(record.endpoint_dir)) == 3
    # and once it has loaded, both answer
    time.sleep(3)
    for _ in range(8):
        assert len(json.loads(urllib.request.urlopen(req).read())[0]) == 3
    assert Endpoints(str(home)).get("cli-ep").status == "InService"
    Endpoints(str(home)).delete("cli-ep")
    _nothing_left(home, "cli-ep")


def test_port_in_use_and_bad_model_data_are_refused(home, tmp_path):
    archive, _ = torchscript_archive(str(tmp_path / "m"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValidationError, match=f"port {port} .* already in use"):
            shipyard.PyTorchModel(archive).deploy(1, "local", endpoint_name="busy", port=port)
    _nothing_left(home, "busy")
    with pytest.raises(ValidationError, match="does not exist"):
        shipyard.PyTorchModel(str(tmp_path / "nope.tar.gz")).deploy(endpoint_name="nomodel")
    _nothing_left(home, "nomodel")
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(os.path.join(str(tmp_path / "m"), "model.pt"), arcname="../model.pt")
    with pytest.raises(ValidationError, match="outside the model directory"):
        shipyard.PyTorchModel(str(evil)).deploy(endpoint_name="evil")
    _nothing_left(home, "evil")
    assert not (tmp_path / "model.pt").exists()
    with pytest.raises(ValidationError, match="no training job|does not exist"):
        shipyard.Model("no-such-job").deploy(endpoint_name="nojob")


def test_model_that_fails_to_load_reports_failed_never_healthy(home, tmp_path):
    archive, _ = torchscript_archive(
        str(tmp_path / "m"),
        extra={
            "code/inference.py": "def model_fn(model_dir):\n"
            "    raise RuntimeError('weights "
            "missing')\n"
        },
    )
    with pytest.raises(EndpointError, match="model_fn failed: RuntimeError: weights missing"):
        shipyard.PyTorchModel(archive).deploy(endpoint_name="broken")
    _nothing_left(home, "broken")
    # without waiting: the record says Failed with the reason; /ping is never 200
    shipyard.PyTorchModel(archive).deploy(endpoint_name="broken2", wait=False)
    endpoints = Endpoints(str(home))
    with pytest.raises(EndpointError, match="weights missing"):
        endpoints.wait("broken2", timeout=120)
    record = endpoints.get("broken2")
    assert record.status == "Failed" and "weights missing" in record.failure_reason
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(record.url + "/ping", timeout=10)
    assert err.value.code == 500 and b"weights missing" in err.value.read()
    endpoints.delete("broken2")
    _nothing_left(home, "broken2")


def test_requirements_and_lib_in_model_code(home, tmp_path):
    archive, net = torchscript_archive(
        str(tmp_path / "m"),
        extra={
            "code/requirements.txt": "numpy\n",
            "code/lib/scaler/__init__.py": "FACTOR = 3.0\n",
            "code/inference.py": textwrap.dedent("""
            import scaler

            def output_fn(prediction, accept):
                return str(float(prediction.sum()) * scaler.FACTOR), "text/plain"
        """),
        },
    )
    predictor = shipyard.PyTorchModel(archive).deploy(endpoint_name="withreq")
    try:
        from shipyard.sdk.deserializers import StringDeserializer
        from shipyard.sdk.serializers import JSONSerializer

        predictor.serializer = JSONSerializer()
        predictor.deserializer = StringDeserializer()
        got = float(predictor.predict([[1, 2, 3, 4]]))
        want = float(net(__import__("torch").tensor([[1.0, 2, 3, 4]])).sum()) * 3
        assert abs(got - want) < 1e-4
        cache = os.path.join(str(home), "cache", "requirements")
        assert any(n.startswith("req-") and not n.endswith(".lock") for n in os.listdir(cache))
    finally:
        predictor.delete_endpoint()
    _nothing_left(home, "withreq")
