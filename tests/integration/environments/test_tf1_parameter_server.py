"""The tf-distribution-options notebook's parameter_server estimator as written
(``framework_version='1.13'``, ``distribution={'parameter_server': {'enabled': True}}``): a
TF1 ``replica_device_setter`` script trains on 2 instances with TensorFlow 1.13 in Python
3.7, in SageMaker's master/worker/ps layout (TF 1.x has no ParameterServerStrategy), the
parameter servers in the job's own TensorFlow, and describe shows where its variables went
(issue 38)."""

from __future__ import annotations

import pytest

import shipyard

pytest.importorskip("uv")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow, pytest.mark.timeout(600)]

TF1_PS_SCRIPT = r"""
import json, os, sys
import numpy as np
import tensorflow as tf

tf.logging.set_verbosity(tf.logging.INFO)
cfg = json.loads(os.environ["TF_CONFIG"])
task = cfg["task"]
print("task", task["type"], task["index"], "tf", tf.__version__, "py", sys.version.split()[0])
cluster = tf.train.ClusterSpec(cfg["cluster"])
if task["type"] == "ps":
    tf.train.Server(cluster, job_name="ps", task_index=task["index"]).join()
server = tf.train.Server(cluster, job_name=task["type"], task_index=task["index"])
device = "/job:%s/task:%d" % (task["type"], task["index"])
with tf.device(tf.train.replica_device_setter(worker_device=device, cluster=cluster)):
    x = tf.placeholder(tf.float32, [None, 4])
    y = tf.placeholder(tf.float32, [None, 1])
    w = tf.get_variable("w", [4, 1])
    b = tf.get_variable("b", [1])
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    step = tf.train.get_or_create_global_step()
    train = tf.train.AdamOptimizer(0.05).minimize(loss, global_step=step)
rng = np.random.RandomState(task["index"])
hooks = [tf.train.StopAtStepHook(last_step=100)]
with tf.train.MonitoredTrainingSession(
    master=server.target, is_chief=task["type"] == "master", hooks=hooks
) as sess:
    while not sess.should_stop():
        xs = rng.rand(32, 4).astype("float32")
        sess.run(train, {x: xs, y: xs.sum(1, keepdims=True)})
print("TF1 PS OK", task["type"], flush=True)
"""


def test_the_notebooks_tf_1_13_parameter_server_estimator_trains_on_2_instances(
    session, write_script, monkeypatch, capsys, python_3_7
):
    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", TF1_PS_SCRIPT),
        instance_count=2,
        instance_type="ml.c5.large",
        framework_version="1.13",
        py_version="py3",
        distribution={"parameter_server": {"enabled": True}},
        environment={"TF_CPP_MIN_LOG_LEVEL": "2"},
        session=session,
    )
    est.fit(job_name="tf113-ps")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    out, _ = capsys.readouterr()
    assert "task master 0 tf 1.13." in out and "py 3.7." in out  # SageMaker's TF1 layout
    # the worker trained beside it (the master deciding the job's end, as on SageMaker)
    assert "TF1 PS OK master" in out and "task worker 0 tf 1.13." in out
    report = desc["Shipyard"]["DistributionReport"]
    assert report["layout"] == "sagemaker"
    assert report["num_shards"] == 2
    # every variable on a parameter server: w, b, the global step and Adam's slots
    assert {v["key"] for v in report["placement"]} >= {"w", "b", "global_step"}
    assert all(s["answered"] and s["bytes_in"] > 0 for s in report["shards"])


HVD_TF1_SCRIPT = r"""
import sys
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
print("rank", hvd.rank(), "of", hvd.size(), "tf", tf.__version__, "py", sys.version.split()[0])
x = tf.placeholder(tf.float32, [None, 4])
y = tf.placeholder(tf.float32, [None, 1])
w = tf.get_variable("w", [4, 1])
b = tf.get_variable("b", [1])
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
step = tf.train.get_or_create_global_step()
train = hvd.DistributedOptimizer(tf.train.AdamOptimizer(0.05)).minimize(loss, global_step=step)
hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=50)]
rng = np.random.RandomState(hvd.rank())
with tf.train.MonitoredTrainingSession(hooks=hooks) as sess:
    while not sess.should_stop():
        xs = rng.rand(32, 4).astype("float32")
        _, last = sess.run([train, w], {x: xs, y: xs.sum(1, keepdims=True)})
print("weights", hvd.rank(), last.ravel().round(5).tolist(), flush=True)
"""


def test_the_notebooks_horovod_estimator_at_1_13_trains_on_2_instances(
    session, write_script, monkeypatch, capsys, python_3_7
):
    """Its Horovod estimator (``distribution={'mpi': ...}``) on TensorFlow 1.13 in Python 3.7:
    mpi4py has no wheel there, so the environment builds it against its Open MPI; both ranks
    train the same weights (the broadcast and the allreduce did their work)."""
    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", HVD_TF1_SCRIPT),
        instance_count=2,
        instance_type="ml.c5.large",
        framework_version="1.13",
        py_version="py3",
        distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
        environment={"TF_CPP_MIN_LOG_LEVEL": "2"},
        session=session,
    )
    est.fit(job_name="tf113-hvd")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    out, _ = capsys.readouterr()
    assert "rank 0 of 2 tf 1.13." in out and "rank 1 of 2 tf 1.13." in out and "py 3.7." in out
    weights = dict(
        line.split("weights ", 1)[1].split(" ", 1)
        for line in out.splitlines()
        if "weights " in line
    )
    assert set(weights) == {"0", "1"} and weights["0"] == weights["1"], weights
