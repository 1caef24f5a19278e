"""The shipyard.ps client records how long a split-phase step's requests travelled behind
the worker's compute (issue 39): the overlap the planner predicts another link's step
with. In-process shards (``LocalNetwork``), no processes; the compute is a sleep, so the
assertions are lower bounds a slow machine cannot break."""

from __future__ import annotations

import json
import time

import numpy as np

from shipyard.planner import steps
from shipyard.ps.client import PSClient
from shipyard.ps.consistency import Consistency
from shipyard.ps.core import ServerConfig, ServerCore
from shipyard.ps.transport import LocalNetwork
from shipyard.runtime.steptiming import StepRecorder

SECRET = "overlap-test-secret"
COMPUTE_S = 0.05


def _client(tmp_path) -> tuple[PSClient, StepRecorder]:
    cons = Consistency.parse("async", None)
    net = LocalNetwork(
        [
            ServerCore(ServerConfig(index=i, num_shards=2, consistency=cons), SECRET)
            for i in range(2)
        ]
    )
    c = PSClient(
        worker_id=0, secret=SECRET, transport_factory=net.connect, heartbeat_interval=0, timeout=20
    )
    c.register(
        {"big": np.zeros(100_000, np.float32), "small": np.zeros(3, np.float32)},
        {"name": "sgd", "lr": 1.0},
    )
    rec = StepRecorder(str(tmp_path / "step-timing-1.json"), "shipyard.ps client")
    c._data.recorder = rec
    return c, rec


def test_split_phase_step_records_the_compute_its_requests_travelled_behind(tmp_path):
    c, rec = _client(tmp_path)
    grads = {"big": np.ones(100_000, np.float32), "small": np.ones(3, np.float32)}
    rec.mark()  # the clock starts at the first step's end
    for _ in range(3):
        c.push_pull_begin({"big": grads["big"]})  # backward's first gradient goes out
        time.sleep(COMPUTE_S)  # the rest of backward
        c.push_pull_begin({"small": grads["small"]})
        c.push_pull_end()
    rec.flush()
    doc = json.loads((tmp_path / "step-timing-1.json").read_text())
    assert len(doc["steps"]) == 3
    for seconds, comm, overlap, _ in doc["steps"]:
        assert overlap >= COMPUTE_S  # the sleep ran while "big" was in flight
        assert overlap + comm <= seconds  # begin calls are communication, not overlap
    summary = steps.summarize([doc])
    assert summary["OverlapSeconds"] >= COMPUTE_S
    c.close()


def test_blocking_push_pull_records_no_overlap(tmp_path):
    c, rec = _client(tmp_path)
    rec.mark()
    for _ in range(3):
        c.push_pull({"big": np.ones(100_000, np.float32)})
    rec.flush()
    doc = json.loads((tmp_path / "step-timing-1.json").read_text())
    assert all(len(s) == 2 for s in doc["steps"])  # nothing travelled behind compute
    assert steps.summarize([doc])["OverlapSeconds"] is None
    c.close()
