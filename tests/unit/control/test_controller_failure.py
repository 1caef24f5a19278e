"""FailurePolicy on the real supervisor: the root cause is the earliest recorded failure,
not the first one polled; an instance stopped because another failed is not the cause."""

from __future__ import annotations

from shipyard.backends.inprocess import InProcessBackend, Script
from shipyard.control.lifecycle import JobStatus
from shipyard.control.policies import FailurePolicy


def test_the_earliest_failure_time_wins_over_the_order_failures_are_seen(make_job):
    job = make_job(hosts=2)
    # algo-2 exits first and is seen first; algo-1's agent recorded its failure earlier
    # (at 1 ms) but took 60 ms to exit (its peer's connection error is the consequence)
    backend = InProcessBackend(
        {
            "algo-1": Script(exit_code=1, seconds=0.06, failed_at=0.001, failure="OOM in step 3"),
            "algo-2": Script(exit_code=1, seconds=0.01, failure="ConnectionResetError"),
        }
    )
    record = job.supervisor(backend, settle=1.0).run()
    assert record.status is JobStatus.FAILED
    assert record.failure_reason.startswith("[algo-1] OOM in step 3"), record.failure_reason
    assert job.instances() == {"algo-1": ("Failed", 1), "algo-2": ("Failed", 1)}


def test_when_the_first_seen_is_also_the_earliest_it_is_the_cause(make_job):
    job = make_job(hosts=2)
    backend = InProcessBackend(
        {
            "algo-1": Script(exit_code=1, seconds=0.06, failure="ConnectionResetError"),
            "algo-2": Script(exit_code=2, seconds=0.01, failure="KeyError: 'label'"),
        }
    )
    record = job.supervisor(backend, settle=1.0).run()
    assert record.failure_reason.startswith("[algo-2] KeyError: 'label'"), record.failure_reason


def test_a_host_stopped_because_another_failed_is_not_the_cause(make_job):
    job = make_job(hosts=3)
    backend = InProcessBackend(
        {
            "algo-1": Script(seconds=None),  # runs until stopped
            "algo-2": Script(exit_code=1, seconds=0.01, failure="RuntimeError: NaN loss"),
            "algo-3": Script(seconds=None),
        }
    )
    record = job.supervisor(backend).run()
    assert record.failure_reason.startswith("[algo-2] RuntimeError: NaN loss")
    assert job.instances() == {
        "algo-1": ("Stopped", -15),
        "algo-2": ("Failed", 1),
        "algo-3": ("Stopped", -15),
    }
    assert backend.stops and backend.stops[-1][1] == 0.05  # the stop policy's grace


def test_an_exit_without_a_failure_file_says_so(make_job):
    job = make_job(hosts=1)
    backend = InProcessBackend({"algo-1": Script(exit_code=137, seconds=0.0)})
    record = job.supervisor(backend).run()
    assert record.failure_reason == (
        "[algo-1] instance exited with status 137 without writing a failure reason"
    )


def test_root_cause_choice_alone():
    policy = FailurePolicy(settle_seconds=0)
    assert policy.root_cause("algo-2", {"algo-1": 5.0, "algo-2": 6.0, "algo-3": None}) == "algo-1"
    assert policy.root_cause("algo-2", {"algo-1": None, "algo-2": None}) == "algo-2"
    tie = {"algo-2": 5.0, "algo-10": 5.0}  # a tie: the first in host order, not by name
    assert policy.root_cause("algo-10", tie) == "algo-2"
