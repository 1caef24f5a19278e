"""Step times shipyard measures with no change to the script (issue 39), for the sources the
first module (test_step_timing.py) does not cover: torch DDP (``torch_distributed``), TF1
sessions, Horovod's Keras API and plain Keras ``fit``. Each job is a tiny script that knows
nothing of shipyard and trains a known number of steps; describe's ``StepTiming`` must
count them per worker, keep warm-up apart, split compute from communication where there
is a wire, and ``shipyard plan --json`` must say the step time is shipyard's measurement.
"""

from __future__ import annotations

import json

import pytest

import shipyard
from tests.integration.test_cli import cli

STEPS = 24

DDP_SCRIPT = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({STEPS}):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
dist.destroy_process_group()
""".replace("{STEPS}", str(STEPS))
DDP_BYTES = (64 * 256 + 256 + 256 * 10 + 10) * 4  # every gradient, float32, once per step
# the same, written for SageMaker's data parallel library (shipyard's smddp shim)
SMDDP_SCRIPT = DDP_SCRIPT.replace(
    "from torch.nn.parallel import DistributedDataParallel as DDP",
    "import smdistributed.dataparallel.torch.torch_smddp\n"
    "from smdistributed.dataparallel.torch.parallel.distributed import "
    "DistributedDataParallel as DDP",
).replace('init_process_group("gloo")', 'init_process_group(backend="smddp")')

TF1_SCRIPT = """
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
x = tf1.placeholder(tf.float32, [None, 32])
y = tf1.placeholder(tf.int32, [None])
w1 = tf1.get_variable("w1", [32, 64])
w2 = tf1.get_variable("w2", [64, 10])
loss = tf1.losses.sparse_softmax_cross_entropy(y, tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2))
step = tf1.train.get_or_create_global_step()
train = tf1.train.AdamOptimizer(1e-3).minimize(loss, global_step=step)
rng = np.random.default_rng(0)
with tf1.train.MonitoredTrainingSession(hooks=[tf1.train.StopAtStepHook(last_step={STEPS})]) as sess:
    while not sess.should_stop():
        feed = {x: rng.normal(size=(16, 32)), y: rng.integers(0, 10, 16)}
        sess.run(loss, feed_dict=feed)  # an evaluation: not a step
        sess.run([train, loss], feed_dict=feed)
print("trained")
""".replace("{STEPS}", str(STEPS))
TF1_BYTES = (32 * 64 + 64 * 10) * 4

HVD_KERAS_SCRIPT = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow.keras as hvd
import keras
import numpy as np

hvd.init()
keras.utils.set_random_seed(hvd.rank())
x = np.random.default_rng(hvd.rank()).normal(size=({STEPS} * 16, 32)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=16, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
print("trained")
""".replace("{STEPS}", str(STEPS))
HVD_KERAS_BYTES = (32 * 64 + 64 + 64 * 2 + 2) * 4

KERAS_SCRIPT = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np

x = np.random.default_rng(0).normal(size=({STEPS} * 16, 32)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=16, epochs=1, verbose=0)
print("trained")
""".replace("{STEPS}", str(STEPS))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One SHIPYARD_HOME for the module's jobs."""
    path = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHIPYARD_HOME", str(path))
        mp.setenv("AWS_REGION", "us-east-1")
        yield path


def _run(home, tmp_path, framework, script, name, instances=1, distribution=None):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(script)
    cls = shipyard.PyTorch if framework == "pytorch" else shipyard.TensorFlow
    est = cls(
        entry_point="train.py",
        source_dir=str(src),
        instance_count=instances,
        instance_type="local",
        distribution=distribution,
        session=shipyard.Session(home=str(home)),
    )
    est.fit(job_name=name, logs=False)
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    return desc


def _planned_from_measurement(name: str, timing: dict, source: str, nbytes: int) -> None:
    # gradient bytes given: only parameter-server jobs leave a placement report to read
    res = cli(
        "plan",
        name,
        "--instance-type",
        "ml.c5.xlarge",
        "--instances",
        "1,2",
        "--gradient-bytes",
        str(nbytes),
        "--json",
    )
    assert res.returncode == 0, res.stderr
    measured = json.loads(res.stdout)["measured"]
    assert measured["step_s"] == pytest.approx(timing["MedianStepSeconds"])
    said = measured["sources"]["step_time"]
    assert said.startswith("measured by shipyard (") and source in said, said


@pytest.mark.timeout(300)
def test_torch_ddp_steps_are_timed_with_their_buckets(home, tmp_path):
    pytest.importorskip("torch")
    desc = _run(
        home,
        tmp_path,
        "pytorch",
        DDP_SCRIPT,
        "ddp-steps",
        instances=2,
        distribution={"torch_distributed": {"enabled": True}},
    )
    timing = desc["Shipyard"]["StepTiming"]
    assert timing["Source"] == "torch DDP" and timing["Workers"] == 2
    assert sorted(w["Host"] for w in timing["PerWorker"]) == ["algo-1", "algo-2"]
    # the first forward starts the clock; each later one ends a step
    assert [w["Steps"] for w in timing["PerWorker"]] == [STEPS - 1, STEPS - 1]
    assert timing["WarmupStepsExcluded"] >= 4
    assert all(w["StartupSeconds"] > 0 for w in timing["PerWorker"])
    # a wire: the buckets' allreduce is communication, apart from compute
    assert timing["CommSeconds"] > 0 and timing["ComputeSeconds"] > 0
    assert timing["OverlapSeconds"] is not None
    assert timing["BytesPerStep"] == DDP_BYTES
    _planned_from_measurement("ddp-steps", timing, "torch DDP", DDP_BYTES)


@pytest.mark.timeout(300)
def test_smddp_scripts_are_timed_as_the_ddp_they_run_on(home, tmp_path):
    pytest.importorskip("torch")
    assert "smdistributed" in SMDDP_SCRIPT and "gloo" not in SMDDP_SCRIPT
    desc = _run(
        home,
        tmp_path,
        "pytorch",
        SMDDP_SCRIPT,
        "smddp-steps",
        instances=2,
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
    )
    timing = desc["Shipyard"]["StepTiming"]
    assert timing["Source"] == "torch DDP" and timing["Workers"] == 2
    assert [w["Steps"] for w in timing["PerWorker"]] == [STEPS - 1, STEPS - 1]
    assert timing["CommSeconds"] > 0 and timing["BytesPerStep"] == DDP_BYTES


@pytest.mark.tensorflow
@pytest.mark.timeout(300)
def test_tf1_session_training_runs_are_the_steps(home, tmp_path):
    pytest.importorskip("tensorflow")
    desc = _run(home, tmp_path, "tensorflow", TF1_SCRIPT, "tf1-steps")
    timing = desc["Shipyard"]["StepTiming"]
    # the runs that fetch the train op, not the evaluation runs between them
    assert timing["Source"] == "tf session" and timing["Workers"] == 1
    assert timing["StepsRun"] == STEPS
    assert timing["Steps"] == STEPS - timing["WarmupStepsExcluded"] > 0
    assert timing["MedianStepSeconds"] > 0 and timing["CommSeconds"] is None
    _planned_from_measurement("tf1-steps", timing, "tf session", TF1_BYTES)


@pytest.mark.tensorflow
@pytest.mark.timeout(360)
def test_horovod_keras_steps_are_timed_with_their_allreduce(home, tmp_path):
    pytest.importorskip("keras")
    pytest.importorskip("mpi4py")
    desc = _run(
        home,
        tmp_path,
        "tensorflow",
        HVD_KERAS_SCRIPT,
        "hvd-keras-steps",
        instances=2,
        distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
    )
    timing = desc["Shipyard"]["StepTiming"]
    # Keras fit's callback times the batches; Horovod's reduction adds its wait to them
    assert timing["Source"] == "keras fit + horovod allreduce" and timing["Workers"] == 2
    assert [w["Steps"] for w in timing["PerWorker"]] == [STEPS, STEPS]
    assert 0 < timing["CommSeconds"] < timing["MedianStepSeconds"]
    assert timing["ComputeSeconds"] > 0
    assert timing["BytesPerStep"] == HVD_KERAS_BYTES
    _planned_from_measurement("hvd-keras-steps", timing, "horovod allreduce", HVD_KERAS_BYTES)


@pytest.mark.tensorflow
@pytest.mark.timeout(300)
def test_plain_keras_fit_without_a_distribution_is_timed(home, tmp_path):
    pytest.importorskip("keras")
    desc = _run(home, tmp_path, "tensorflow", KERAS_SCRIPT, "keras-steps")
    timing = desc["Shipyard"]["StepTiming"]
    assert timing["Source"] == "keras fit" and timing["Workers"] == 1
    assert timing["StepsRun"] == STEPS and timing["WarmupStepsExcluded"] >= 2
    assert timing["CommSeconds"] is None
    _planned_from_measurement("keras-steps", timing, "keras fit", HVD_KERAS_BYTES)
