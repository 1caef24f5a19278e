"""The plan section's options: a page's query string -> the planner's inputs, every bad
one refused with what was wrong and what to give instead."""

from __future__ import annotations

import pytest

from shipyard.dashboard import plan
from shipyard.errors import ValidationError


def test_an_empty_query_takes_the_clis_defaults() -> None:
    q = plan.query({})
    assert q == plan.Query()
    assert plan.counts(q.instances) == [1, 2, 4, 8, 16, 32, 64]


def test_numbers_and_options_are_read_under_the_clis_names() -> None:
    q = plan.query(
        {
            "instance_type": "ml.p3.2xlarge,100mbit",
            "instances": "8,2,2",
            "distribution": "horovod",
            "compute_time": "0.05",
            "step_time": "0.2",
            "steps": "10",
            "gradient_bytes": "4e6",
            "allreduce": "reduce_bcast",
        }
    )
    assert (q.compute_time, q.step_time, q.steps, q.gradient_bytes) == (0.05, 0.2, 10, 4e6)
    assert plan.counts(q.instances) == [2, 8]  # sorted, once each
    assert q.allreduce == "reduce_bcast" and q.distribution == "horovod"


BAD = [
    ({"instancez": "2"}, "unknown plan option(s) ['instancez']"),
    ({"step_time": "fast"}, "step_time='fast': give a number above 0"),
    ({"compute_time": "-1"}, "compute_time='-1': give a number above 0"),
    ({"gradient_bytes": "nan"}, "gradient_bytes='nan'"),
    ({"steps": "2.5"}, "steps='2.5': give a whole number above 0"),
    ({"allreduce": "tree"}, "allreduce='tree': use ring or reduce_bcast"),
]


@pytest.mark.parametrize(("params", "message"), BAD)
def test_a_bad_option_says_which_and_what_to_give(params: dict, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        plan.query(params)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2,x", "give instance counts separated by commas"),
        ("0,2", "each 1..4096"),
        ("5000", "each 1..4096"),
        (",".join(map(str, range(1, 40))), "give 1 to 32 counts"),
        ("", "give 1 to 32 counts"),
    ],
)
def test_counts_are_bounded(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        plan.counts(text)


def test_targets_are_types_at_their_sustained_rate_or_rates() -> None:
    p3, rate = plan.links("ml.p3.2xlarge, 100mbit/2ms", "local")
    assert (p3.name, p3.bytes_per_s) == ("ml.p3.2xlarge", 2.5e9 / 8)  # the baseline of "up to 10"
    assert (rate.name, rate.bytes_per_s, rate.latency_s) == ("100mbit/2ms", 100e6 / 8, 4e-3)
    (own,) = plan.links("instance-type", "ml.p3.16xlarge")  # the tag's own spelling
    assert own.bytes_per_s == 25e9 / 8


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ml.zz.xlarge", "its network bandwidth is not known"),
        ("local", "has no rated network"),
        ("fast", "'fast' does not parse"),
        (",".join(["1gbit"] * 9), "give 1 to 8 SageMaker types or rates"),
    ],
)
def test_bad_targets_say_what_to_give(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        plan.links(text, "local")


def test_the_default_types_are_the_jobs_own_when_it_has_a_rated_network() -> None:
    assert plan.default_types("ml.p3.16xlarge") == "ml.p3.16xlarge"
    assert plan.default_types("local") == plan.FALLBACK_TYPES
