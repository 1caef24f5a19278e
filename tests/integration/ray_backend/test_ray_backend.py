"""The same jobs on a real 3-node Ray cluster on this machine (see conftest.py)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import job_processes
from tests.integration.ray_backend.conftest import NODE_CPUS, NODE_IPS, leftovers
from tests.integration.test_contract import run_contract_job


@pytest.mark.timeout(240)
def test_contract_on_three_nodes(ray_session, ray_cluster, write_script, tmp_path):
    job = "ray-contract"
    table = run_contract_job(
        ray_session, write_script, tmp_path, job_name=job, cpus=str(NODE_CPUS),
        base_of=lambda host: os.path.join(ray_cluster.workdir, job, "instances", host))
    # each instance on a node of its own, named by the node's real address
    assert sorted(table.values()) == sorted(NODE_IPS)
    desc = ray_session.control.describe(job)
    assert {i["Host"]: i["Address"] for i in desc["Shipyard"]["Instances"]} == table
    assert desc["Shipyard"]["Backend"] == f"ray@{ray_cluster.address}"
    assert leftovers(ray_cluster.workdir, job) == []
    assert job_processes(ray_cluster.workdir) == []
