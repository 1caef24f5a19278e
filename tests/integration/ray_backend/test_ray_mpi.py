"""The ``mpi`` distribution on a real multi-node Ray cluster: no ssh between the nodes.

algo-1's mpirun starts prted on algo-2's node through algo-2's instance (mpi_rsh); each
rank reads its own instance's world on its own node (see docs/ray.md).
"""

from __future__ import annotations

import json
import os

import pytest

import shipyard
from tests.integration.ray_backend.test_ray_backend import _assert_on_nodes

RANK_SCRIPT = r"""
import json, os, socket
import numpy as np
import shipyard.horovod as hvd

hvd.init()
r = hvd.rank()
total = hvd.allreduce(np.array([r + 1.0]), op=hvd.Sum)
host = os.environ["SM_CURRENT_HOST"]
record = {"rank": r, "size": hvd.size(), "sum": total.tolist(), "host": host,
          "resolved": socket.gethostbyname(host), "plan": os.environ.get("SHIPYARD_MPI_PLAN")}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank{r}.json"), "w") as fh:
    json.dump(record, fh)
print("rank", r, "on", host, "sum", total.tolist(), flush=True)
"""


@pytest.mark.timeout(240)
def test_mpi_ranks_on_two_nodes_without_ssh(ray_session, ray_cluster, write_script):
    pytest.importorskip("mpi4py")
    src = write_script("train.py", RANK_SCRIPT)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=ray_session,
        distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
    )
    est.fit(job_name="ray-mpi")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    addresses = {i["Host"]: i["Address"] for i in desc["Shipyard"]["Instances"]}
    for rank, host in enumerate(("algo-1", "algo-2")):
        path = os.path.join(
            desc["Shipyard"]["JobDir"], "instances", host, "model", f"rank{rank}.json"
        )
        with open(path) as fh:  # written on the rank's own node, brought back by Ray
            rec = json.load(fh)
        assert rec["size"] == 2 and rec["sum"] == [3.0] and rec["host"] == host
        assert rec["resolved"] == addresses[host]
        # algo-2's rank was started by algo-2's instance, with its own copy of the plan
        assert (rec["plan"] is not None) == (host == "algo-2")
    _assert_on_nodes(ray_session, ray_cluster)
