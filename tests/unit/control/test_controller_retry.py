"""RetryPolicy on the real supervisor: a failed attempt restarts every instance, up to
max_retry_attempts more; only failures retry."""

from __future__ import annotations

from shipyard.backends.inprocess import InProcessBackend, Script
from shipyard.control.lifecycle import AttemptKind, JobStatus
from shipyard.control.policies import AttemptResult, RetryPolicy

FAIL = Script(exit_code=1, seconds=0.01, failure="ValueError: bad batch")
OK = Script(exit_code=0, seconds=0.01, model={"model.txt": "weights"})


def test_a_failed_attempt_is_retried_and_the_retry_succeeds(make_job):
    job = make_job(hosts=2)
    backend = InProcessBackend({"algo-1": [FAIL, OK], "algo-2": [OK, OK]})
    record = job.supervisor(backend, retries=1).run()
    assert record.status is JobStatus.COMPLETED, record.failure_reason
    assert backend.launches == 2 and record.attempt == 2
    assert "Restarting" in job.secondary()
    first = job.store.attempts(job.name)[0]
    assert "[algo-1] ValueError: bad batch" in (first["failure_reason"] or "")
    assert job.instances(1)["algo-1"] == ("Failed", 1)
    assert job.instances(2) == {"algo-1": ("Completed", 0), "algo-2": ("Completed", 0)}
    assert record.model_artifact and record.failure_reason is None


def test_retries_exhausted_fail_the_job_with_the_last_attempts_reason(make_job):
    job = make_job(hosts=1)
    backend = InProcessBackend({"algo-1": FAIL})
    record = job.supervisor(backend, retries=2).run()
    assert record.status is JobStatus.FAILED
    assert backend.launches == 3 and record.attempt == 3
    assert record.failure_reason.startswith("[algo-1] ValueError: bad batch")
    assert job.secondary().count("Restarting") == 2
    assert record.model_artifact is None  # a failed job uploads nothing


def test_without_retries_the_first_failure_ends_the_job(make_job):
    job = make_job(hosts=1)
    backend = InProcessBackend({"algo-1": [FAIL, OK]})
    record = job.supervisor(backend, retries=0).run()
    assert record.status is JobStatus.FAILED and backend.launches == 1


def test_only_failures_retry():
    policy = RetryPolicy(max_retry_attempts=3)
    assert policy.should_retry(AttemptResult(AttemptKind.FAILED), 3)
    assert not policy.should_retry(AttemptResult(AttemptKind.FAILED), 4)
    for kind in (AttemptKind.STOPPED, AttemptKind.MAX_RUNTIME, AttemptKind.SUCCEEDED):
        assert not policy.should_retry(AttemptResult(kind), 1)
