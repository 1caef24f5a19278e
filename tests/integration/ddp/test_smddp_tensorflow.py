"""``smdistributed.dataparallel`` with the TensorFlow estimator (issue 28): a TF2 custom
training loop written for ``import smdistributed.dataparallel.tensorflow as dist`` trains on
2 instances x 2 processes under the mpi runner, and its ranks end with identical weights;
so does a TF1 ``MonitoredTrainingSession`` script with SMDDP's hook and optimizer; a
framework_version SageMaker never ran it with is refused before anything starts."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import shipyard
from shipyard.errors import DistributionError
from tests.conftest import job_processes
from tests.lazy import needs

pytestmark = needs("tensorflow", "mpi4py")

HERE = os.path.dirname(os.path.abspath(__file__))
SMDDP_2x2 = {"smdistributed": {"dataparallel": {"enabled": True, "processes_per_host": 2}}}


def _source(tmp_path) -> str:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(HERE, "smddp_tf2_train.py"), src / "train.py")
    return str(src)


def ranks_of(job_dir: str, hosts: list[str]) -> tuple[dict[int, dict], dict[int, list]]:
    """Every rank's record and final weights, read from the instance that ran it."""
    records, weights = {}, {}
    for host in hosts:
        model = os.path.join(job_dir, "instances", host, "model")
        for name in sorted(os.listdir(model)):
            path = os.path.join(model, name)
            if name.startswith("rank-"):
                with open(path) as fh:
                    rec = json.load(fh)
                records[rec["rank"]] = rec
            elif name.startswith("weights-"):
                with np.load(path) as npz:
                    weights[int(name[len("weights-") : -len(".npz")])] = [
                        npz[k] for k in sorted(npz.files, key=lambda k: int(k.split("_")[1]))
                    ]
    return records, weights


def assert_trained_identically(records: dict[int, dict], weights: dict[int, list]) -> None:
    size = len(records)
    assert sorted(weights) == list(range(size))
    for r, rec in records.items():
        assert rec["size"] == size
        assert rec["sum"] == size * (size + 1) / 2  # allreduce(..., param_index, num_params, SUM)
        assert rec["losses"] == records[0]["losses"]  # oob_allreduce: the same average everywhere
        for a, b in zip(weights[r], weights[0]):
            np.testing.assert_array_equal(a, b)
    losses = records[0]["losses"]
    assert losses[-1] < losses[0] / 2, losses  # it trained


@pytest.mark.timeout(300)
def test_tf2_loop_for_smddp_trains_on_2x2_with_identical_ranks(session, tmp_path, monkeypatch):
    # the shim on the installed TensorFlow: 2.4.1 would build TensorFlow 2.13.1 first, which
    # tests/integration/environments does (the suite's one framework environment build)
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_ENVS", "off")
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=_source(tmp_path),
        instance_count=2,
        instance_type="local",
        framework_version="2.4.1",  # the workshop's: SageMaker ran SMDDP v1.2.0 there
        py_version="py37",
        distribution=SMDDP_2x2,
        environment={"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"},
        session=session,
    )
    est.fit(job_name="smddp-tf2")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    job_dir = desc["Shipyard"]["JobDir"]
    records, weights = ranks_of(job_dir, ["algo-1", "algo-2"])
    assert sorted(records) == [0, 1, 2, 3]
    for r, rec in records.items():
        assert rec["host"] == f"algo-{r // 2 + 1}"
        assert (rec["local_rank"], rec["local_size"]) == (r % 2, 2)
        assert rec["version"].endswith("+shipyard")
    assert_trained_identically(records, weights)
    assert job_processes(job_dir) == []


@pytest.mark.timeout(300)
def test_tf1_estimator_era_script_with_the_hook_and_optimizer_ends_identical(
    session, tmp_path, monkeypatch
):
    """SMDDP's TF1 parts: ``DistributedOptimizer`` around a ``tf.compat.v1.train`` optimizer
    and ``BroadcastGlobalVariablesHook`` in a ``MonitoredTrainingSession``. The ranks start
    from different random weights; the hook makes them rank 0's, and the averaged gradients
    keep them equal."""
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_ENVS", "off")  # the installed TensorFlow, as above
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(HERE, "smddp_tf1_train.py"), src / "train.py")
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=str(src),
        instance_count=2,
        instance_type="local",
        framework_version="2.4.1",
        py_version="py37",
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        environment={"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"},
        session=session,
    )
    est.fit(job_name="smddp-tf1")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    job_dir = desc["Shipyard"]["JobDir"]
    ranks = {}
    for host in ("algo-1", "algo-2"):
        model = os.path.join(job_dir, "instances", host, "model")
        for name in os.listdir(model):
            if name.startswith("tf1-rank-"):
                with open(os.path.join(model, name)) as fh:
                    rec = json.load(fh)
                ranks[rec["rank"]] = rec
    assert sorted(ranks) == [0, 1]
    assert ranks[1]["first"] == ranks[0]["first"]  # the hook broadcast rank 0's weights
    np.testing.assert_allclose(ranks[1]["final"][0], ranks[0]["final"][0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(ranks[1]["final"][1], ranks[0]["final"][1], rtol=0, atol=1e-6)
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0]  # it trained
    assert job_processes(job_dir) == []


@pytest.mark.parametrize("version", ["2.12", "2.16.1", "1.15.5"])
def test_a_version_smddp_never_had_for_tensorflow_is_refused(session, tmp_path, home, version):
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=_source(tmp_path),
        instance_count=2,
        instance_type="local",
        framework_version=version,
        distribution=SMDDP_2x2,
        session=session,
    )
    with pytest.raises(DistributionError, match="TensorFlow 2.3 to 2.11") as err:
        est.fit(job_name="smddp-refused")
    assert repr(version) in str(err.value)
    assert "'mpi'" in str(err.value)  # what to use instead
    assert session.control.list() == []


def test_pytorch_launcher_options_are_refused_for_the_tensorflow_client(session, tmp_path):
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=_source(tmp_path),
        instance_count=1,
        instance_type="local",
        framework_version="2.9",
        distribution={"smdistributed": {"dataparallel": {"enabled": True, "master_port": 29600}}},
        session=session,
    )
    with pytest.raises(DistributionError, match="master_port") as err:
        est.fit(job_name="smddp-master-port")
    assert "smdistributed.dataparallel" in str(err.value)
    assert session.control.list() == []


SINGLE = r"""
import tensorflow as tf
import smdistributed.dataparallel.tensorflow as dist

dist.init()
assert (dist.size(), dist.rank(), dist.local_rank(), dist.local_size()) == (1, 0, 0, 1)
t = tf.constant([1.0, 2.0])
assert dist.allreduce(t, 0, 1).numpy().tolist() == [1.0, 2.0]
assert dist.allreduce(t, 0, 1, op=dist.ReduceOp.SUM, compression=dist.Compression.fp16).numpy().tolist() == [1.0, 2.0]
assert dist.oob_allreduce(t).numpy().tolist() == [1.0, 2.0]
assert dist.overlap(t) is t
v = tf.Variable([3.0])
dist.broadcast_variables([v], root_rank=0)
with tf.GradientTape() as tape:
    y = v * 2.0
assert dist.DistributedGradientTape(tape).gradient(y, v).numpy().tolist() == [2.0]
for bad, call in (
    ("param_index and num_params must be integers", lambda: dist.allreduce(t, "w", 1)),
    ("device_dense and device_sparse are not supported", lambda: dist.DistributedGradientTape(tf.GradientTape(), device_dense="/gpu:0")),
    ("device_dense and device_sparse are not supported", lambda: dist.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), device_sparse="/gpu:0")),
    ("bucket_cap_mb must be a positive size", lambda: dist.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), bucket_cap_mb=0)),
    ("bucket_cap_mb must be a positive size", lambda: dist.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), bucket_cap_mb=1e-7)),
):
    try:
        call()
    except (TypeError, ValueError) as exc:
        assert bad in str(exc), exc
    else:
        raise AssertionError(bad)
dist.barrier()
dist.shutdown()
print("SINGLE OK")
"""


@pytest.mark.timeout(180)
def test_the_shim_runs_as_one_rank_outside_a_job_and_refuses_what_smddp_refused(tmp_path):
    """A script run by hand (no mpirun) is one rank, as the library allowed; the arguments
    SMDDP refused are refused naming them."""
    import subprocess
    import sys

    from shipyard.ddp import shim_path

    script = tmp_path / "single.py"
    script.write_text(SINGLE)
    env = dict(
        os.environ, PYTHONPATH=shim_path(), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=170
    )
    assert proc.returncode == 0 and "SINGLE OK" in proc.stdout, proc.stderr[-2000:]
