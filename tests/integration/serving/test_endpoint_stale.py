"""Issue 20, defect 9 (endpoints): a server killed behind the store's back is listed
Failed by ``shipyard endpoints``, not InService, and its leftovers are stopped.

Before the fix only ``get`` reconciled; the listing showed the dead endpoint InService.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

import shipyard
from shipyard.control.endpoints import Endpoints
from tests.integration.serving.serving_helpers import server_processes, torchscript_archive

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def test_killed_server_is_listed_failed(home, tmp_path):
    archive, _ = torchscript_archive(str(tmp_path / "m"))
    shipyard.PyTorchModel(archive).deploy(1, "local", endpoint_name="stale-ep")
    record = Endpoints(str(home)).get("stale-ep")
    assert record.status == "InService"
    server = psutil.Process(record.pid)
    server.kill()
    server.wait(timeout=10)  # reaped: a pid that is simply gone
    listed = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "endpoints", "--json"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    rows = {r["EndpointName"]: r for r in json.loads(listed.stdout)}
    assert rows["stale-ep"]["EndpointStatus"] == "Failed", rows["stale-ep"]
    assert "ended unexpectedly" in rows["stale-ep"]["FailureReason"]
    assert server_processes(record.endpoint_dir) == []
