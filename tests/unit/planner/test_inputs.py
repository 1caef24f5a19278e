"""The shipyard:network tag's values and a finished job's describe -> the planner's Profile."""

from __future__ import annotations

import pytest

from shipyard.errors import ValidationError
from shipyard.planner import model
from shipyard.planner.profile import Inputs, PlanInputError, from_describe
from shipyard.sandbox import shaping


def test_tag_values():
    assert shaping.parse("50mbit", "local") == shaping.Shape(50e6, 0.0, "50mbit")
    shape = shaping.parse("1gbit/2ms", "local")
    assert (shape.rate_bits_per_s, shape.delay_s) == (1e9, 0.002)
    assert shape.describe() == "1 Gbit/s, 2 ms one way (1gbit/2ms)"
    typed = shaping.parse("instance-type", "ml.p3.2xlarge")
    assert typed.rate_bits_per_s == 2.5e9  # the baseline of "up to 10 Gbps"
    assert "baseline 2.5" in typed.describe()
    tags = [{"Key": "team", "Value": "x"}, {"Key": "shipyard:network", "Value": "10mbit"}]
    assert shaping.from_tags(tags, "local").rate_bits_per_s == 10e6
    assert shaping.from_tags([{"Key": "team", "Value": "x"}], "local") is None


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("50mbps", "'50mbps' does not parse.*50mbit"),
        ("fast", "'fast' does not parse"),
        ("50mbit/2", "latency '2' does not parse"),
        ("1bit", "below 8 kbit/s"),
        ("instance-type", "'local'.*not known.*10gbit"),
    ],
)
def test_bad_tag_values_say_what_to_write(value, match):
    with pytest.raises(ValidationError, match=match):
        shaping.parse(value, "local")


def test_tbf_commands():
    args = shaping.tbf_args("eth0", shaping.Shape(50e6))
    assert args[:6] == ["qdisc", "add", "dev", "eth0", "root", "tbf"]
    assert args[args.index("rate") + 1] == "50000000bit"
    assert int(args[args.index("burst") + 1]) == 16384  # 1 ms at 50 Mbit is below the floor
    fast = shaping.tbf_args("eth0", shaping.Shape(10e9), parent="1:1")
    assert fast[4:6] == ["parent", "1:1"] and int(fast[fast.index("burst") + 1]) == 1_250_000


def _desc(**over):
    desc = {
        "TrainingJobName": "j",
        "TrainingJobStatus": "Completed",
        "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2},
        "AlgorithmSpecification": {"TrainingImage": "pytorch"},
        "TrainingTimeInSeconds": 30,
        "Tags": [],
        "Shipyard": {
            "Distribution": {"kind": "parameter_server", "options": {}},
            "MetricHistory": [
                {"MetricName": "step_time", "Value": 0.3, "Host": "algo-1"},
                {"MetricName": "step_time", "Value": 0.5, "Host": "algo-1"},
                {"MetricName": "step_time", "Value": 0.3, "Host": "algo-2"},
            ],
            "DistributionReport": {
                "policy": "greedy_bytes",
                "consistency": {"mode": "async"},
                "placement": [{"bytes": 1000}, {"bytes": 100}],
                # 10 steps x 2 workers; shard 1 holds one key
                "shards": [{"keys": 1, "pushes": 20}, {"keys": 1, "pushes": 20}],
                "traffic": {
                    "bytes_to_shard": [[11000, 1100], [11000, 1100]],
                    "bytes_from_shard": [[10000, 1000], [10000, 1000]],
                },
            },
        },
    }
    desc.update(over)
    return desc


def test_profile_of_a_parameter_server_job():
    m = from_describe(_desc())
    p = m.profile
    assert (p.distribution, p.placement, p.consistency) == ("shipyard_ps", "greedy_bytes", "async")
    assert p.variables == (1000.0, 100.0)
    assert m.step_s == pytest.approx(0.4)  # mean of each host's last value
    assert p.compute_s == pytest.approx(0.4)  # unshaped: no communication subtracted
    assert (p.push_overhead, p.pull_overhead) == (pytest.approx(1.1), pytest.approx(1.0))
    assert m.sources["step_time"] == "the job's step-time metric"
    tf = _desc(AlgorithmSpecification={"TrainingImage": "tensorflow"})
    assert from_describe(tf).profile.distribution == "tf_parameter_server"


def test_a_shaped_job_s_communication_is_taken_out_of_its_compute():
    shaped = _desc(Tags=[{"Key": "shipyard:network", "Value": "8kbit"}])  # 1000 B/s
    m = from_describe(shaped, Inputs(step_s=3.0))
    # greedy on 2 shards: the algo-2 worker moves 1000 x (1.1 + 1.0) remotely = 2.1 s of
    # payload, in TCP frames of 1514 bytes per 1448: 2.1 x 1514/1448 = 2.1957 s
    assert m.profile.compute_s == pytest.approx(3.0 - 2.1 * 1514 / 1448)
    assert "less 2.196s" in m.sources["compute_time"]


def test_steps_from_push_counts_and_the_given_inputs():
    desc = _desc()
    desc["Shipyard"]["MetricHistory"] = []
    m = from_describe(desc)
    assert m.step_s == pytest.approx(30 / 10)  # TrainingTimeInSeconds / 10 steps
    assert "upper bound" in m.sources["step_time"]
    g = from_describe(desc, Inputs(compute_s=0.01, gradient_bytes=4e6, distribution="horovod"))
    assert (g.profile.compute_s, g.profile.variables) == (0.01, (4e6,))
    assert g.profile.distribution == "horovod"
    assert g.sources["compute_time"] == "given (--compute-time)"


@pytest.mark.parametrize(
    ("desc", "given", "match"),
    [
        (
            _desc(TrainingJobStatus="InProgress"),
            Inputs(),
            "is InProgress: plan needs a job that has ended",
        ),
        (
            _desc(Shipyard={"Distribution": {"kind": "mpi", "options": {}}}),
            Inputs(),
            "measured no variable sizes.*--gradient-bytes",
        ),
        (
            _desc(Shipyard={"Distribution": {"kind": "mpi", "options": {}}}),
            Inputs(gradient_bytes=100),
            "measured no step time.*metric_definitions.*--step-time",
        ),
        (_desc(), Inputs(distribution="ring"), "--distribution 'ring' is not known"),
    ],
)
def test_what_is_missing_is_named_with_how_to_get_it(desc, given, match):
    with pytest.raises(PlanInputError, match=match):
        from_describe(desc, given)


def test_planned_rows_from_a_profile():
    m = from_describe(_desc())
    rows = model.plan(m.profile, [model.Link("ml.p3.16xlarge", 25e9 / 8)], [1, 2, 64])
    assert [r.instances for r in rows] == [1, 2, 64]
    assert rows[0].efficiency == 1.0 and rows[0].bottleneck == "compute"


def test_a_shared_host_s_measurement_is_read_with_its_cores():
    # 4 workers (2 instances x 2 per host) measured 0.4 s per step unshaped on 2 cores:
    # the CPU bound, not compute + communication, explains the step -> 0.2 s of compute
    desc = _desc(
        Shipyard={
            **_desc()["Shipyard"],
            "Distribution": {"kind": "mpi", "options": {"processes_per_host": 2}},
        }
    )
    m = from_describe(desc, Inputs(step_s=0.4, gradient_bytes=1e6, host_cores=2))
    assert m.profile.compute_s == pytest.approx(0.2)
    assert m.profile.host_cores == 2
    assert "2 cores' share of 4 workers" in m.sources["compute_time"]
    assert "one machine of 2 cores" in m.sources["shared_host"]
    alone = from_describe(desc, Inputs(step_s=0.4, gradient_bytes=1e6))
    assert alone.profile.compute_s == pytest.approx(0.4)
    assert "shared_host" not in alone.sources
