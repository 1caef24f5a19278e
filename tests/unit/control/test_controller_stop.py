"""StopPolicy on the real supervisor: a stop request ends the attempt, the instances get
SIGTERM, the grace, then SIGKILL; a stop during the environment phase starts nothing."""

from __future__ import annotations

import threading
import time

from shipyard.backends.inprocess import InProcessBackend, Script
from shipyard.control.envphase import Outcome
from shipyard.control.hooks import Hook
from shipyard.control.lifecycle import JobStatus


def _stop_after(job, seconds: float) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: (time.sleep(seconds), job.store.request_stop(job.name)), daemon=True
    )
    thread.start()
    return thread


def test_a_stop_request_during_an_attempt_stops_the_job(make_job):
    job = make_job(hosts=2)
    backend = InProcessBackend({"algo-1": Script(seconds=None), "algo-2": Script(seconds=None)})
    _stop_after(job, 0.05)
    record = job.supervisor(backend, retries=3).run()
    assert record.status is JobStatus.STOPPED and str(record.secondary_status) == "Stopped"
    assert backend.launches == 1  # a stop is not retried
    assert job.instances() == {"algo-1": ("Stopped", -15), "algo-2": ("Stopped", -15)}
    assert "Stopping" in job.secondary()
    assert record.model_artifact is None and record.failure_reason is None


def test_an_instance_that_ignores_sigterm_is_killed_after_the_grace(make_job):
    job = make_job(hosts=2)
    backend = InProcessBackend(
        {"algo-1": Script(seconds=None, ignores_stop=True), "algo-2": Script(seconds=None)}
    )
    _stop_after(job, 0.02)
    record = job.supervisor(backend, grace=0.05).run()
    assert record.status is JobStatus.STOPPED
    assert job.instances() == {"algo-1": ("Stopped", -9), "algo-2": ("Stopped", -15)}
    assert backend.stops == [(["algo-1", "algo-2"], 0.05)]


def test_a_signal_to_the_supervisor_stops_the_job(make_job):
    job = make_job(hosts=1)
    backend = InProcessBackend({"algo-1": Script(seconds=None)})
    sup = job.supervisor(backend)
    threading.Timer(0.03, lambda: setattr(sup, "signalled", True)).start()
    assert sup.run().status is JobStatus.STOPPED


class SlowEnvironment(Hook):
    """The environment phase's contract: polls should_stop while it builds, and a stop
    abandons the build (envphase.run's BuildCancelled -> Outcome(stopped=True))."""

    def __init__(self, should_stop) -> None:
        self.should_stop = should_stop
        self.polls = 0

    def on_job_start(self) -> Outcome:
        while not self.should_stop():
            self.polls += 1
            time.sleep(0.005)
        return Outcome(stopped=True)


def test_a_stop_during_the_environment_phase_starts_no_instance(make_job):
    job = make_job(hosts=2)
    backend = InProcessBackend()
    sup = job.supervisor(backend)
    phase = SlowEnvironment(sup.should_stop)
    sup.hooks.insert(0, phase)
    _stop_after(job, 0.05)
    record = sup.run()
    assert record.status is JobStatus.STOPPED and phase.polls > 0
    assert backend.launches == 0 and job.store.instances(job.name) == []
    assert "Training" not in job.secondary()


def test_a_failed_environment_phase_fails_the_job_before_any_instance(make_job):
    job = make_job(hosts=1)
    backend = InProcessBackend()
    sup = job.supervisor(backend)

    class Refused(Hook):
        def on_job_start(self) -> Outcome:
            return Outcome(failure="ClientError: tensorflow 0.1 cannot be installed")

    sup.hooks.insert(0, Refused())
    record = sup.run()
    assert record.status is JobStatus.FAILED and backend.launches == 0
    assert record.failure_reason == "ClientError: tensorflow 0.1 cannot be installed"
