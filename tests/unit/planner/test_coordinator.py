"""TensorFlow's ParameterServerStrategy as its coordinator runs it (issue 39): the cases
are the runs of examples/tensorflow/cifar10_ps.py (Keras ``fit``, 3 epochs x 16 steps,
RMSprop) on 2 and 3 instances at 100 Mbit/s, predicted from a 2-instance unshaped run,
with the numbers their describe output recorded (placement report, relay counts,
shipyard's step timing)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shipyard.planner import coordinator, model
from shipyard.planner.profile import from_describe

FRAMING = 1514 / 1448
LINK = model.Link("100mbit", 100e6 / 8, framing=FRAMING)  # 100 us per message
# the layers of the CNN: (name, kernel bytes, bias bytes), float32
LAYERS = [
    ("conv2d", 3456, 128),
    ("conv2d_1", 36864, 128),
    ("conv2d_2", 73728, 256),
    ("conv2d_3", 147456, 256),
    ("dense", 4718592, 2048),
    ("dense_1", 20480, 40),
]
SCALARS = ["RMSprop/iter", "RMSprop/decay", "RMSprop/learning_rate", "RMSprop/momentum"]


def _entries(shard_of) -> list[dict]:
    """The placement report's entries in creation order (as the 2-instance run recorded
    them), ``shard_of(i)`` placing the i-th non-slot one; each slot on its variable's."""
    names = [("Variable", 8, True)]
    for layer, kernel, bias in LAYERS:
        names += [(f"{layer}/kernel", kernel, True), (f"{layer}/bias", bias, True)]
    names += [("total", 4, False), ("count", 4, False)]
    names += [(s, 8 if s.endswith("iter") else 4, False) for s in SCALARS]
    names += [("RMSprop/rho", 4, False)]
    entries, where = [], {}
    for i, (key, size, trainable) in enumerate(names):
        where[key] = shard_of(i)
        entries.append({"key": key, "bytes": size, "shard": [where[key]], "trainable": trainable})
    for key, size, _ in names[1:13]:  # RMSprop's "rms" slot of every layer variable
        entries.append(
            {"key": f"RMSprop/{key}/rms", "bytes": size, "shard": [where[key]], "trainable": False}
        )
    return entries


def _run_2() -> list[dict]:
    # as measured: kernels on ps:1, biases and the first Variable on ps:0, RMSprop/iter
    # after one variable the report does not list
    return _entries(lambda i: (i + (1 if i >= 15 else 0)) % 2)


KERNELS = sum(k for _, k, _ in LAYERS)  # 5,000,576 B: everything on ps:1 at 2 instances
BIASES = 8 + sum(b for _, _, b in LAYERS)  # 2,864 B on ps:0


def _keras_ps_desc(entries, shards, instances=2, tags=()) -> dict:
    """The describe output of the unshaped 2-instance run (load 1.9)."""
    return {
        "TrainingJobName": "keras-ps-unshaped-2",
        "TrainingJobStatus": "Completed",
        "ResourceConfig": {"InstanceType": "local", "InstanceCount": instances},
        "AlgorithmSpecification": {"TrainingImage": "tensorflow"},
        "TrainingTimeInSeconds": 16,
        "Tags": list(tags),
        "Shipyard": {
            "Distribution": {"kind": "parameter_server", "options": {"enabled": True}},
            "MetricHistory": [],
            "DistributionReport": {
                "implementation": "tensorflow",
                "layout": "tf2",
                "policy": "round_robin",
                "num_shards": shards,
                "placement": entries,
                # the relays: 5 MB pulled per worker step, the gradients not seen
                "traffic": {
                    "peers": ["chief:0", "worker:0", "worker:1", "ps:0", "ps:1"],
                    "bytes_to_shard": [[457684, 517442], [136603, 134318], [153064, 150268]],
                    "bytes_from_shard": [[26133, 5041591], [78215, 110032857], [92390, 130039699]],
                },
            },
            "StepTiming": {
                "Source": "keras fit",
                "Workers": 1,
                "StepsRun": 48,
                "WarmupStepsExcluded": 16,
                "Steps": 32,
                "MedianStepSeconds": 0.066526,
                "P90StepSeconds": 0.069404,
                "ComputeSeconds": None,
                "CommSeconds": None,
                "OverlapSeconds": None,
                "BytesPerStep": None,
                "PerWorker": [],
            },
        },
    }


def _profile() -> model.Profile:
    return from_describe(_keras_ps_desc(_run_2(), 2)).profile


def test_slots_stay_on_their_variable_s_ps_and_never_cross():
    entries = _run_2()
    # the run's report: 5,740 B on ps:0 and 10,001,164 B on ps:1, slots included
    assert [sum(e["bytes"] for e in entries if e["shard"] == [j]) for j in (0, 1)] == [
        5740,
        10_001_164,
    ]
    turns, loads = coordinator.read_placement(entries, 2)
    # 13 trainable variables and 7 non-trainable ones take turns; the 12 slots do not
    assert len(turns) == 20
    assert sum(turns) == KERNELS + BIASES == 5_003_440  # the gradient: no slot, no scalar
    assert loads == (BIASES, KERNELS)  # the measured shards' trainable bytes
    # TF1's naming (<variable>/<slot>) is a slot too; a scalar of the optimizer is not
    tf1 = [
        {"key": "w", "bytes": 40, "shard": [0], "trainable": True},
        {"key": "w/Adam", "bytes": 40, "shard": [0], "trainable": False},
        {"key": "beta1_power", "bytes": 4, "shard": [1], "trainable": False},
    ]
    assert coordinator.read_placement(tf1, 2) == ((40.0, 0.0), (40.0, 0.0))


def test_the_profile_of_a_keras_ps_job_reads_the_coordinator():
    m = from_describe(_keras_ps_desc(_run_2(), 2))
    p = m.profile
    assert (p.dispatch, p.steps_per_epoch, p.ps_loads) == ("coordinator", 16, (BIASES, KERNELS))
    assert p.gradient_bytes == 5_003_440  # it read 10.0 MB (slots included) before
    assert (p.push_overhead, p.pull_overhead) == (1.0, 1.0)
    assert "every 16 steps" in m.sources["dispatch"]
    assert "optimizer slots" in m.sources["gradient_bytes"]
    # SageMaker's layout (each worker its own loop) and shipyard.ps keep the worker model
    sagemaker = _keras_ps_desc(_run_2(), 2)
    sagemaker["Shipyard"]["DistributionReport"]["layout"] = "sagemaker"
    assert from_describe(sagemaker).profile.dispatch == "worker"
    assert from_describe(sagemaker).profile.gradient_bytes == pytest.approx(10_006_904)


def test_two_instances_the_worker_beside_the_hot_ps_runs_most_steps():
    """Measured at 100 Mbit/s: 9.12, 8.75, 8.96 and 9.17 worker steps/s in four
    sittings; the remote worker ran 6 of the 48 steps (2 an epoch), the one beside ps:1
    the other 42. The model said 2.09-2.22 before (every worker paying 10 MB each way)."""
    p = from_describe(_keras_ps_desc(_run_2(), 2)).profile
    row = model.predict(p, LINK, 2)
    # the remote worker pulls ps:1's 5,000,576 B and sends the gradients back, sharing
    # its NIC's directions with the other worker's 2,864 B for ps:0
    remote = 0.066526 + 2 * (KERNELS + BIASES) * FRAMING / 12.5e6 + 2e-4
    # the worker beside ps:1 moves ps:0's 2,864 B, sharing with the remote one's flows
    local = 0.066526 + 4 * BIASES * FRAMING / 12.5e6 + 2e-4
    # an epoch of 16: the queue runs dry after 14 starts beyond the first two, then the
    # longest of the steps in flight (uniform residuals: R/2 + L^2/(6R) for two)
    dry = 14 / (1 / local + 1 / remote)
    epoch = dry + remote / 2 + local**2 / (6 * remote)
    assert row.steps_per_s == pytest.approx(16 / epoch)
    assert row.step_s == pytest.approx(2 / row.steps_per_s)  # W x epoch / steps, as timed
    # 12.0: 31% above the measured median (the worker beside ps:1 ran ~100 ms a step
    # there, see the module's "Not modelled"); the old model was 75% below it
    assert 9.0 < row.steps_per_s < 12.5
    assert row.bottleneck == "hot ps:1"
    # spreading the bytes makes both workers remote: no advice to do it at 2
    assert "partitioner" not in row.advice and row.speedup is None


def test_three_instances_share_the_hot_ps_nic():
    # the 3-instance run's trainable bytes per ps (ps:2 the hot one)
    a, b, hot = 153_096.0, 94_592.0, 4_755_752.0
    comm, busiest = coordinator.worker_comm([a, b, hot], 3, 1, 1.0, 1.0)
    # a remote worker's pull of the hot ps shares its egress with the other remote
    # worker's and the third worker's gradients for ps:0 and ps:1: a + b + 2 hot, and the
    # same for its gradients into the hot ps' ingress
    assert comm[0] == pytest.approx(2 * (a + b + 2 * hot))
    assert comm[1] == pytest.approx(2 * (a + b + 2 * hot))
    # the worker beside it waits its share for ps:0 and ps:1: 3a + b each way
    assert comm[2] == pytest.approx(2 * (3 * a + b))
    assert busiest == pytest.approx(2 * hot + a + b)
    # a NIC direction shared by flows of 1, 2 and 5: the 2 ends after 1 + 2 + 2
    pipe = coordinator._Pipe([5.0, 1.0, 2.0])
    assert [pipe.finish(x) for x in (1.0, 2.0, 5.0)] == [3.0, 5.0, 8.0]
    # re-placed for 3 from the 2-instance report: the hot ps holds the same variables
    # as the 3-instance run's ps:2 did (and the first Variable's 8 B)
    p = from_describe(_keras_ps_desc(_run_2(), 2)).profile
    loads = coordinator.shard_loads(p, 3, None)
    assert max(loads) == hot + 8
    row = model.predict(p, LINK, 3)
    # measured 5.04, 5.73, 5.54; the remote workers take 2 steps an epoch
    assert 4.5 < row.steps_per_s < 5.8
    assert row.bottleneck.startswith("hot ps")


def test_the_epoch_waits_for_its_last_step():
    # a worker of 0.1 s beside one of 1.0 s, 16 steps: the queue runs dry at
    # 14 / (10 + 1) s, then the longer of two uniform residuals: 0.5 + 0.01 / 6
    assert coordinator.epoch_s([0.1, 1.0], 16) == pytest.approx(14 / 11 + 0.5 + 0.01 / 6)
    assert coordinator.expected_max_residual([1.0, 1.0]) == pytest.approx(2 / 3)
    assert coordinator.expected_max_residual([0.3]) == pytest.approx(0.15)
    # a lone worker's 16 steps take 16 of its steps (its phase is no chance), and equal
    # workers never finish faster than their summed rate
    assert coordinator.epoch_s([0.5], 16) == pytest.approx(8.0)
    assert coordinator.epoch_s([0.5, 0.5], 16) == pytest.approx(4.0)
    lone = model.predict(replace(_profile(), compute_s=0.1), LINK, 1)
    assert (lone.steps_per_s, lone.efficiency) == (pytest.approx(10.0), pytest.approx(1.0))
    # fewer steps than workers: one each for the fastest, all at once
    assert coordinator.epoch_s([1.0, 0.1, 0.2], 2) == pytest.approx(0.2)
    assert coordinator.epoch_s([1.0, 0.1], 0) == 0.0
    p = model.Profile("tf_parameter_server", 0.1, (1e6,), dispatch="coordinator")
    steady = model.predict(p, model.Link("x", 1e6, 0.0), 2)
    # no epoch known: the rates add up (the worker beside the ps 10/s, the other 1/1.1)
    assert steady.steps_per_s == pytest.approx(10 + 1 / 2.1)


def test_a_hot_ps_still_limits_the_remote_workers():
    p = from_describe(_keras_ps_desc(_run_2(), 2)).profile
    row = model.predict(p, LINK, 8)
    assert row.bottleneck.startswith("hot ps")
    assert "MinSizePartitioner" in row.advice
    # the partitioner's shards: the job's chunk (2 MiB) or smaller ones, the better
    small = max(64 * 1024.0, p.gradient_bytes / 32)
    best = max(
        coordinator.row(replace(p, chunk_bytes=c), LINK, 8, "sliced").steps_per_s
        for c in (p.chunk_bytes, small)
    )
    assert row.speedup == pytest.approx(best / row.steps_per_s)
    assert row.speedup > 1.5


def test_a_shaped_reference_s_compute_is_what_explains_its_step():
    p = model.Profile("tf_parameter_server", 0.05, (3e6, 1e3), dispatch="coordinator")
    row = model.predict(p, LINK, 2)
    assert coordinator.compute_of(p, LINK, 2, row.step_s) == pytest.approx(0.05, rel=1e-6)
    shaped = _keras_ps_desc(_run_2(), 2, tags=[{"Key": "shipyard:network", "Value": "100mbit"}])
    shaped["Shipyard"]["StepTiming"]["MedianStepSeconds"] = 0.219303  # the 100 Mbit/s run
    m = from_describe(shaped)
    assert model.predict(m.profile, LINK, 2).step_s == pytest.approx(0.219303, rel=0.05)
    assert "coordinator" in m.sources["compute_time"]


def test_steps_per_epoch_only_from_a_keras_coordinator_of_several_epochs():
    timing = {"Source": "keras fit", "Workers": 1, "WarmupStepsExcluded": 16, "StepsRun": 48}
    assert coordinator.steps_per_epoch(timing) == 16
    assert coordinator.steps_per_epoch({**timing, "StepsRun": 16}) is None
    assert coordinator.steps_per_epoch({**timing, "Source": "shipyard.ps client"}) is None
    with pytest.raises(ValueError, match="dispatch 'gossip'"):
        model.predict(model.Profile("tf_parameter_server", 0.1, (1.0,), dispatch="gossip"), LINK, 2)
    with pytest.raises(ValueError, match="coordinator' for tf_parameter_server"):
        model.predict(model.Profile("shipyard_ps", 0.1, (1.0,), dispatch="coordinator"), LINK, 2)
