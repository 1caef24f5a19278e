"""The "same machine" model's transport term (issue 39): shipyard.ps' push/pull CPU, measured
per byte between two instances here, is charged on the cores the workers share, and a
same-machine reading takes the compute the ps client measured rather than deriving it
from the link. Inputs look like the demo's measured runs (the tutorials' CNN, 5 MB, 2
instances on 2 cores); every figure is computed by hand, so each term can fail alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shipyard.planner import model, render
from shipyard.planner.profile import Inputs, from_describe
from tests.unit.planner.test_inputs import _desc

GBIT = 1e9 / 8
PER_BYTE = 0.9e-9  # CPU seconds per payload byte (0.9 CPU-s per GB, what the probe reads)
CNN = (2.5e6, 2.5e6)  # two shards' worth of the CNN's 5 MB
TEN = model.Link("ml.p2.8xlarge", 10 * GBIT, latency_s=0.0)
SLOW = model.Link("ml.p2.xlarge", 1.25 * GBIT, latency_s=0.0)


def _ps(compute_s: float = 0.033) -> model.Profile:
    return model.Profile("shipyard_ps", compute_s, CNN, placement="greedy_bytes")


def _machine(per_byte: float | None = PER_BYTE) -> model.Machine:
    return model.Machine(cores=2, bytes_per_s=18.5 * GBIT, ps_cpu_s_per_byte=per_byte)


def test_the_shared_host_step_adds_the_transport_s_cpu():
    # 2 workers on 2 cores: no stretch without the transport; with 18 ms of it per
    # global step, (2 x 33 + 18) / 2 = 42 ms
    assert model.shared_host_step(0.033, 2, 2) == 0.0
    assert model.shared_host_step(0.033, 2, 2, 0.018) == pytest.approx(0.042)
    assert model.shared_host_step(0.033, 2, None, 0.018) == 0.0  # cores of their own
    assert model.shared_host_step(0.1, 4, 2) == pytest.approx(0.2)  # unchanged


def test_the_transport_s_cpu_per_global_step():
    # every worker pushes 5 MB and pulls 5 MB: 2 workers x 10 MB x 0.9 ns = 18 ms
    p = model.Profile("shipyard_ps", 0.033, CNN, host_cpu_s_per_byte=PER_BYTE)
    assert model.transport_cpu_s(p, 2) == pytest.approx(0.018)
    assert model.transport_cpu_s(_ps(), 2) == 0.0  # a profile for real instances


def test_at_10_gbit_the_cores_not_the_link_pace_the_step():
    """The demo's 10 Gbit/s run: 33 ms of compute, a link that needs 4 ms; the step is
    the cores' (2 x 33 + 18) / 2 = 42 ms, named host CPU with the transport's figure."""
    row = model.same_machine(_ps(), TEN, 2, _machine())
    link_s = 5e6 / (10 * GBIT)  # the busiest NIC: a push and a pull of 2.5 MB each
    assert row.comm_s == pytest.approx(link_s)
    assert row.step_s == pytest.approx(0.042)
    assert row.steps_per_s == pytest.approx(2 / 0.042)
    assert row.bottleneck == "host CPU"
    assert "shipyard.ps' push/pull costs 18.0 ms of CPU a step here" in row.advice
    # a transport that cost nothing: compute + link, the figure the issue found too fast
    free = model.same_machine(_ps(), TEN, 2, _machine(0.0))
    assert free.step_s == pytest.approx(0.033 + link_s)
    assert free.bottleneck == "compute"


def test_at_1_25_gbit_the_link_still_paces_the_step():
    row = model.same_machine(_ps(), SLOW, 2, _machine())
    assert row.step_s == pytest.approx(0.033 + 5e6 / (1.25 * GBIT))  # 73 ms > 42 ms
    assert row.bottleneck != "host CPU"


def test_only_shipyard_ps_pays_it_and_unknown_is_no_figure():
    ring = model.Profile("horovod", 0.033, CNN, fusion_bytes=0)
    assert model.same_machine(ring, TEN, 2, _machine(None)).step_s == pytest.approx(
        model.same_machine(ring, TEN, 2, _machine()).step_s
    )
    unknown = model.Machine(2, 18.5 * GBIT, ps_cpu_s_per_byte=None, ps_why="shard exited")
    with pytest.raises(model.Unpredictable, match=r"push/pull cost .* unknown \(shard exited\)"):
        model.same_machine(_ps(), TEN, 2, unknown)
    assert render.same_machine_cell(_ps(), TEN, 2, unknown).startswith(
        "(no prediction: shipyard.ps' push/pull cost on this machine is unknown"
    )


def test_the_compute_explaining_a_cpu_bound_step_leaves_the_transport_out():
    # 42 ms measured, 4 ms of link: the cores say (2 x 42 ms - 18 ms) / 2 = 33 ms
    assert model.compute_of(0.042, 0.004, 2, 2, extra_cpu_s=0.018) == pytest.approx(0.033)
    assert model.compute_of(0.042, 0.004, 2, 2) == pytest.approx(0.038)  # without it


def _demo_run(**over):
    """The demo's 1.25 Gbit/s run as describe gives it (figures of a measured round):
    the declared step_time metric, and the ps client's own compute/push-pull split."""
    desc = _desc(Tags=[{"Key": "shipyard:network", "Value": "1.25gbit"}])
    report = desc["Shipyard"]["DistributionReport"]
    report["placement"] = [{"bytes": b} for b in CNN]
    del report["traffic"]  # wire bytes per tensor byte: 1.0
    desc["Shipyard"]["MetricHistory"] = [
        {"MetricName": "step_time", "Value": 0.0599, "Host": "algo-1"},
        {"MetricName": "step_time", "Value": 0.0621, "Host": "algo-2"},
    ]
    desc["Shipyard"]["StepTiming"] = {
        "Source": "shipyard.ps client",
        "Workers": 2,
        "StepsRun": 28,
        "WarmupStepsExcluded": 4,
        "Steps": 24,
        "MedianStepSeconds": 0.0597,
        "P90StepSeconds": 0.0769,
        "ComputeSeconds": 0.0326,
        "CommSeconds": 0.0267,
        **over,
    }
    return desc


def test_a_same_machine_reading_takes_the_compute_the_ps_client_measured():
    m = from_describe(_demo_run(), Inputs(machine=_machine()))
    share = 0.0326 / (0.0326 + 0.0267)
    assert m.step_s == pytest.approx(0.061)  # the metric still wins for the step
    assert m.profile.compute_s == pytest.approx(0.061 * share)
    assert m.profile.host_cpu_s_per_byte == PER_BYTE
    assert m.sources["compute_time"].startswith("measured by shipyard: 55% of the step outside")
    assert "shipyard.ps 0.90 CPU-s per GB" in m.sources["same_machine"]
    # for real instances the compute is derived as before (step - the link's time)
    real = from_describe(_demo_run())
    assert real.profile.compute_s < m.profile.compute_s
    assert real.profile.host_cpu_s_per_byte == 0.0
    assert real.sources["compute_time"].startswith("measured here: step time")
    # a source whose communication is not the worker's own wait: derived, with the
    # transport's CPU taken out where the cores bound the step
    other = from_describe(_demo_run(Source="keras fit"), Inputs(machine=_machine()))
    assert other.sources["compute_time"].startswith("measured here: step time")
    # a split without compute: derived too
    none = from_describe(_demo_run(ComputeSeconds=None), Inputs(machine=_machine()))
    assert none.profile.compute_s == other.profile.compute_s


def test_the_demo_s_pair_predicted_from_its_slow_run():
    """The issue's case: from the 1.25 Gbit/s run (61 ms a step, 55% of it compute),
    the 10 Gbit/s run (measured 47.6 steps/s in that round) is the cores' step,
    (2 x 33.6 ms + 18 ms) / 2; the model without the split and the transport said
    63 steps/s, 33% fast."""
    m = from_describe(_demo_run(), Inputs(machine=_machine()))
    row = model.same_machine(m.profile, TEN, 2, _machine())
    assert row.step_s == pytest.approx(m.profile.compute_s + 0.018 / 2)
    assert row.bottleneck == "host CPU"
    measured = 47.63
    # both terms: 2%; the split alone leaves 11%, the transport alone 15%
    assert abs(row.steps_per_s - measured) / measured < 0.05
    old = from_describe(_demo_run(), Inputs(host_cores=2))
    before = model.predict(old.profile, model.Link("x", 10 * GBIT, framing=model.TCP_FRAMING), 2)
    assert (before.steps_per_s - measured) / measured > 0.3


# --- the measured overlap and the transport's CPU inside the measured compute (issue 39)


def test_a_measured_overlap_window_hides_the_link_up_to_its_length():
    """At 1.25 Gbit/s the link needs 32 ms a step (5 MB); a window of half a 30 ms
    compute hides 15 ms of it: 30 + 32 - 15 = 47 ms (charged whole after compute: 62 ms).
    At 10 Gbit/s the 4 ms fit whole: the step is the compute."""
    link_s = 5e6 / (1.25 * GBIT)
    plain = model.predict(_ps(0.030), SLOW, 2)
    assert plain.step_s == pytest.approx(0.030 + link_s)
    windowed = model.predict(replace(_ps(0.030), overlap_window=0.5), SLOW, 2)
    assert windowed.step_s == pytest.approx(0.030 + link_s - 0.015)
    fast = model.predict(replace(_ps(0.030), overlap_window=0.5), TEN, 2)
    assert fast.step_s == pytest.approx(0.030)
    assert model.hidden_s(replace(_ps(0.030), overlap_window=0.5), 0.004) == pytest.approx(0.004)


def test_the_cores_bound_counts_the_transport_s_cpu_once():
    """2 workers on 2 cores measured 34 ms of compute while half of the transport's 18 ms
    of CPU a global step ran behind it: 4.5 ms of it in each worker's compute. The cores'
    bound is (2 x (34 - 4.5) + 18) / 2 = 38.5 ms, not (2 x 34 + 18) / 2 = 43 ms."""
    here = replace(_ps(0.034), host_cores=2, host_cpu_s_per_byte=PER_BYTE)
    assert model.predict(here, TEN, 2).step_s == pytest.approx(0.043)
    netted = replace(here, transport_in_compute=0.5)
    assert model.own_compute_s(netted, 2, 0.018) == pytest.approx(0.034 - 0.0045)
    row = model.predict(netted, TEN, 2)
    assert row.step_s == pytest.approx(0.0385) and row.bottleneck == "host CPU"
    # 4 workers on the 2 cores: the transport's CPU spreads over the 4 computes
    assert model.own_compute_s(netted, 4, 0.036) == pytest.approx(0.034 - 0.5 * 0.036 / 4)
    # cores of their own (a real cluster) or no transport: the compute as measured
    assert model.own_compute_s(replace(netted, host_cores=None), 2, 0.018) == 0.034
    assert model.own_compute_s(netted, 2, 0.0) == 0.034


def test_a_same_machine_reading_takes_the_overlap_the_ps_client_measured():
    """The client's window (18 ms behind 32.6 ms of compute, 26.7 ms waited): the profile
    hides up to 55% of the compute's worth of link and nets 40% of the transport's CPU out
    of the compute; a split without an overlap (a job from before it was recorded), a
    plan for real instances and a given compute leave both at 0."""
    m = from_describe(_demo_run(OverlapSeconds=0.018), Inputs(machine=_machine()))
    assert m.profile.overlap_window == pytest.approx(0.018 / 0.0326)
    assert m.profile.transport_in_compute == pytest.approx(0.018 / (0.018 + 0.0267))
    assert m.sources["overlap"].startswith("measured by shipyard: pushed gradients travel")
    assert from_describe(_demo_run(), Inputs(machine=_machine())).profile.overlap_window == 0.0
    assert from_describe(_demo_run(OverlapSeconds=0.018)).profile.overlap_window == 0.0
    given = from_describe(
        _demo_run(OverlapSeconds=0.018), Inputs(machine=_machine(), compute_s=0.01)
    )
    assert given.profile.overlap_window == 0.0 and given.profile.transport_in_compute == 0.0
    # the 1.25 Gbit/s run predicted again from itself (61 ms measured): the compute, the
    # link's 32 ms less the 18.5 ms window, then the 12.5 ms of the 27.5 ms wait that the
    # measured link (33.5 ms with TCP's framing) less the window did not explain: 59.6 ms
    # (charged whole after the compute, the link made it 33.6 + 32 = 65.6 ms)
    row = model.same_machine(m.profile, SLOW, 2, _machine())
    scale = 0.061 / 0.0593
    window = 0.018 * scale
    tail = 0.0267 * scale - (5e6 * model.TCP_FRAMING / (1.25 * GBIT) - window)
    assert m.profile.transport_wait_s == pytest.approx(tail)
    link_s = 5e6 / (1.25 * GBIT)
    assert row.step_s == pytest.approx(m.profile.compute_s + link_s - window + tail)
    assert row.step_s == pytest.approx(0.0596, abs=5e-4)


def test_the_wait_the_link_did_not_explain_follows_the_link_s():
    """A worker waited 9.3 ms after compute for a link that needed 4 ms, all of it in
    flight behind its 15 ms window: the 9.3 ms are the transport's own (the shards'
    updates and replies, the last pieces' receive) and stay at any link, after what a
    slow link leaves exposed (32 - 15 = 17 ms, then the 9.3 ms)."""
    tail = replace(_ps(0.027), overlap_window=15 / 27, transport_wait_s=0.0093)
    assert model.waited_s(tail, 0.004) == pytest.approx(0.0093)
    assert model.predict(tail, TEN, 2).step_s == pytest.approx(0.027 + 0.0093)
    assert model.waited_s(tail, 0.032) == pytest.approx(0.032 - 0.015 + 0.0093)
    assert model.waited_s(replace(tail, transport_wait_s=0.0), 0.004) == 0.0
    # read from the run: 10 Gbit/s, 37.1 ms a step (the metric), 26.8 ms compute + 9.3 ms
    # push/pull, a 15 ms window; the link needs 5 MB x framing / 10 Gbit/s = 4.2 ms, inside
    # the window, so all of the wait (scaled to the step like the compute) is the transport's
    desc = _demo_run(
        MedianStepSeconds=0.0371, ComputeSeconds=0.0268, CommSeconds=0.0093, OverlapSeconds=0.015
    )
    desc["Tags"] = [{"Key": "shipyard:network", "Value": "10gbit"}]
    desc["Shipyard"]["MetricHistory"] = [
        {"MetricName": "step_time", "Value": 0.0371, "Host": h} for h in ("algo-1", "algo-2")
    ]
    m = from_describe(desc, Inputs(machine=_machine()))
    scale = 0.0371 / (0.0268 + 0.0093)
    assert m.profile.transport_wait_s == pytest.approx(0.0093 * scale)
    assert "of its wait is not its link's" in m.sources["overlap"]
    # at 1.25 Gbit/s that run had waited the link less its window instead: no floor left
    slow = dict(desc, Tags=[{"Key": "shipyard:network", "Value": "1.25gbit"}])
    link_s = 5e6 * model.TCP_FRAMING / (1.25 * GBIT)
    assert link_s - 0.015 * scale > 0.0093 * scale
    assert from_describe(slow, Inputs(machine=_machine())).profile.transport_wait_s == 0.0
