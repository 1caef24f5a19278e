"""Step times shipyard measures with no change to the script (issue 39), one real job per
measured source: the project's own unmodified examples, 2 instances, a few steps.

* shipyard.ps (``examples/pytorch/ps_cnn.py``): the client times each step and its
  push/pull; the plan uses that step time, not the job's wall time over its steps.
* Horovod with PyTorch (``examples/horovod/pytorch_mnist.py``, unmodified ``import
  horovod.torch``): each rank's ``DistributedOptimizer.step`` marks a step and the time
  it waited for the gradients' allreduce.
* Keras ``fit`` under TensorFlow's ParameterServerStrategy
  (``examples/tensorflow/cifar10_ps.py``): the TF hook adds a callback timing each batch;
  ``shipyard plan --json`` plans it from that.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

import shipyard
from shipyard.errors import JobFailedError
from tests.integration.test_cli import cli

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One SHIPYARD_HOME for the module's jobs (each job runs once, several tests read it)."""
    path = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHIPYARD_HOME", str(path))
        mp.setenv("AWS_REGION", "us-east-1")
        yield path


@pytest.fixture(scope="module")
def ps_job(home, digits):
    pytest.importorskip("torch")
    est = shipyard.PyTorch(
        entry_point="ps_cnn.py",
        source_dir=os.path.join(EXAMPLES, "pytorch"),
        instance_count=2,
        instance_type="local",
        distribution={"parameter_server": {"enabled": True}},
        # the script's own epoch lines, timestamped as they are logged: the steps' own
        # timing, to check shipyard's against (named so the planner does not use it)
        metric_definitions=[{"Name": "ps_step", "Regex": r"epoch=\d+ step=(\d+)"}],
        session=shipyard.Session(home=str(home)),
    )
    est.fit({"training": digits}, job_name="ps-cnn", logs=False)
    return est.latest_training_job.describe()


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    _load("make_digits", os.path.join(EXAMPLES, "data", "make_digits.py")).write_digits(str(out))
    return str(out)


@pytest.fixture(scope="module")
def horovod_job(home, digits):
    pytest.importorskip("torch")
    pytest.importorskip("mpi4py")
    est = shipyard.PyTorch(
        entry_point="pytorch_mnist.py",
        source_dir=os.path.join(EXAMPLES, "horovod"),
        instance_count=2,
        instance_type="local",
        distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
        hyperparameters={"epochs": 1},
        session=shipyard.Session(home=str(home)),
    )
    est.fit({"training": digits}, job_name="hvd", logs=False)
    return est.latest_training_job.describe()


@pytest.fixture(scope="module")
def keras_ps_job(home, tmp_path_factory):
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    cifar = tmp_path_factory.mktemp("cifar")
    make = _load("make_cifar", os.path.join(EXAMPLES, "data", "make_cifar_tfrecords.py"))
    for split, n, seed in (("train", 128, 1), ("eval", 32, 2)):
        os.makedirs(cifar / split)
        make.write(str(cifar / split / f"{split}.tfrecords"), n, seed)
    est = shipyard.TensorFlow(
        entry_point="cifar10_ps.py",
        source_dir=os.path.join(EXAMPLES, "tensorflow"),
        instance_count=2,
        instance_type="local",
        hyperparameters={"epochs": 2, "steps_per_epoch": 8, "batch_size": 16},
        distribution={"parameter_server": {"enabled": True}},
        session=shipyard.Session(home=str(home)),
    )
    est.fit({"train": str(cifar / "train"), "eval": str(cifar / "eval")}, job_name="k-ps")
    return est.latest_training_job.describe()


@pytest.mark.timeout(240)
def test_shipyard_ps_steps_are_timed_and_planned_from(ps_job):
    assert ps_job["TrainingJobStatus"] == "Completed", ps_job.get("FailureReason")
    timing = ps_job["Shipyard"]["StepTiming"]
    assert timing["Source"] == "shipyard.ps client" and timing["Workers"] == 2
    assert timing["StepsRun"] >= 2 * 10 and timing["WarmupStepsExcluded"] >= 4
    assert timing["Steps"] == timing["StepsRun"] - timing["WarmupStepsExcluded"]
    # the client times its push/pull: communication and compute are apart
    assert 0 < timing["CommSeconds"] < timing["MedianStepSeconds"]
    assert timing["ComputeSeconds"] > 0
    # the steps, not the job's wall time (start-up, data, uploads) over its steps
    steps_per_worker = timing["StepsRun"] / 2
    assert timing["MedianStepSeconds"] < ps_job["TrainingTimeInSeconds"] / steps_per_worker / 2
    res = cli("plan", "ps-cnn", "--instance-type", "ml.p3.2xlarge", "--instances", "1,2", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["measured"]["step_s"] == pytest.approx(timing["MedianStepSeconds"])
    assert plan["measured"]["sources"]["step_time"].startswith("measured by shipyard (")
    assert "shipyard.ps client" in plan["measured"]["sources"]["step_time"]
    # given still wins, and says over what
    given = cli("plan", "ps-cnn", "--instance-type", "1gbit", "--step-time", "0.5", "--json")
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["measured"]["sources"]["step_time"].startswith(
        "given (--step-time) (wins over shipyard's measured "
    )


@pytest.mark.timeout(240)
def test_ps_cnn_is_planned_from_a_step_within_20_percent_of_its_own_timestamps(ps_job):
    """Issue 39's ps_cnn: planned from the step shipyard measured, which agrees with the
    seconds per step between the script's own epoch lines (not wall time over steps)."""
    assert ps_job["TrainingJobStatus"] == "Completed", ps_job.get("FailureReason")
    lines: dict[str, list[tuple[float, float]]] = {}
    for m in ps_job["Shipyard"]["MetricHistory"]:
        if m["MetricName"] == "ps_step":
            at = m["Timestamp"]
            at = at.timestamp() if hasattr(at, "timestamp") else float(at)
            lines.setdefault(m["Host"], []).append((at, float(m["Value"])))
    own = []
    for points in lines.values():
        (t0, s0), (t1, s1) = min(points), max(points)
        assert s1 > s0, points
        own.append((t1 - t0) / (s1 - s0))
    assert len(own) == 2
    own_s = sum(own) / len(own)
    res = cli("plan", "ps-cnn", "--instance-type", "ml.p2.xlarge", "--instances", "2", "--json")
    assert res.returncode == 0, res.stderr
    planned = json.loads(res.stdout)["measured"]["step_s"]
    assert abs(planned - own_s) / own_s <= 0.20, (planned, own_s)
    wall = ps_job["TrainingTimeInSeconds"] / (ps_job["Shipyard"]["StepTiming"]["StepsRun"] / 2)
    assert wall > 1.5 * own_s  # what the plan was made from before: start-up included


@pytest.mark.tensorflow
@pytest.mark.timeout(420)
def test_keras_fit_under_parameter_servers_is_timed_and_planned(keras_ps_job):
    assert keras_ps_job["TrainingJobStatus"] == "Completed", keras_ps_job.get("FailureReason")
    timing = keras_ps_job["Shipyard"]["StepTiming"]
    # the chief (the coordinator) runs fit: 2 epochs x 8 steps; it schedules steps ahead,
    # so whole epochs are timed (each step an eighth of its epoch), the first is warm-up
    assert timing["Source"] == "keras fit" and timing["Workers"] == 1
    assert (timing["StepsRun"], timing["WarmupStepsExcluded"], timing["Steps"]) == (16, 8, 8)
    assert timing["P90StepSeconds"] == timing["MedianStepSeconds"]
    assert timing["MedianStepSeconds"] > 0 and timing["CommSeconds"] is None
    res = cli(
        "plan",
        "k-ps",
        "--instance-type",
        "ml.c5.xlarge,ml.p3.2xlarge",
        "--instances",
        "2,4",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["measured"]["step_s"] == pytest.approx(timing["MedianStepSeconds"])
    assert "keras fit" in plan["measured"]["sources"]["step_time"]
    assert len(plan["rows"]) == 4
    shown = cli("describe", "k-ps")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # as a person reads it, whatever the wrapping
    assert "step timing: measured by shipyard (keras fit): " in text
    assert "of 1 worker(s); 8 warm-up step(s) excluded" in text


@pytest.mark.timeout(240)
def test_horovod_steps_are_timed_with_their_allreduce(horovod_job):
    assert horovod_job["TrainingJobStatus"] == "Completed", horovod_job.get("FailureReason")
    timing = horovod_job["Shipyard"]["StepTiming"]
    assert timing["Source"] == "horovod allreduce" and timing["Workers"] == 2
    assert sorted(w["Host"] for w in timing["PerWorker"]) == ["algo-1", "algo-2"]
    # both ranks step together: the same number of steps each
    assert len({w["Steps"] for w in timing["PerWorker"]}) == 1 and timing["Steps"] > 10
    assert 0 <= timing["CommSeconds"] <= timing["MedianStepSeconds"]
    res = cli("plan", "hvd", "--instance-type", "10gbit", "--gradient-bytes", "1e6", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["measured"]["step_s"] == pytest.approx(timing["MedianStepSeconds"])
    assert "horovod allreduce" in plan["measured"]["sources"]["step_time"]


FAILS_AFTER = """
import sys
import numpy as np
from shipyard.ps.client import PSClient
steps = int(sys.argv[sys.argv.index("--steps") + 1])
client = PSClient()
client.register({"w": np.zeros(1000, dtype="float32")})
for _ in range(steps):
    client.push_pull({"w": np.ones(1000, dtype="float32")})
raise SystemExit("the script's own error after %d steps" % steps)
"""


@pytest.mark.timeout(240)
def test_a_failed_job_is_planned_from_the_steps_it_ran_or_refused_in_one_line(home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(FAILS_AFTER)
    for name, steps in (("fails-late", 40), ("fails-early", 1)):
        est = shipyard.PyTorch(
            entry_point="train.py",
            source_dir=str(src),
            instance_count=1,
            instance_type="local",
            hyperparameters={"steps": steps},
            distribution={"parameter_server": {"enabled": True}},
            session=shipyard.Session(home=str(home)),
        )
        with pytest.raises(JobFailedError):
            est.fit(job_name=name, logs=False)
    late = cli("plan", "fails-late", "--instance-type", "1gbit", "--json")
    assert late.returncode == 0, late.stderr
    sources = json.loads(late.stdout)["measured"]["sources"]
    assert sources["job_status"].startswith("Failed: planned from the steps it ran (")
    assert sources["step_time"].startswith("measured by shipyard (")
    early = cli("plan", "fails-early", "--instance-type", "1gbit")
    assert early.returncode == 2
    said = " ".join(early.stderr.split())  # one line, whatever the terminal's wrapping
    assert "is Failed and cannot be planned: shipyard timed none of its steps" in said
    assert "logs -f" not in said
