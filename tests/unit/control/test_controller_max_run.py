"""MaxRunPolicy on the real supervisor: past max_run the instances are stopped, the job
ends Stopped/MaxRuntimeExceeded, and the artifacts are still uploaded."""

from __future__ import annotations

import os
import tarfile

from shipyard.backends.inprocess import InProcessBackend, Script
from shipyard.control.lifecycle import JobStatus, SecondaryStatus
from shipyard.control.policies import MaxRunPolicy


def test_max_run_stops_the_job_and_keeps_its_artifacts(make_job):
    job = make_job(hosts=2)
    backend = InProcessBackend(
        {
            "algo-1": Script(seconds=None, model={"model.txt": "half-trained"}),
            "algo-2": Script(seconds=None),
        }
    )
    record = job.supervisor(backend, retries=2, max_run=0.1).run()
    assert record.status is JobStatus.STOPPED
    assert record.secondary_status is SecondaryStatus.MAX_RUNTIME_EXCEEDED
    assert (
        record.failure_reason == "MaxRuntimeExceeded: the job ran longer than max_run=0.1 seconds"
    )
    assert backend.launches == 1  # max_run is not retried
    assert job.instances() == {"algo-1": ("Stopped", -15), "algo-2": ("Stopped", -15)}
    model = os.path.join(job.output_dir, job.name, "output", "model.tar.gz")
    assert record.model_artifact and os.path.exists(model)
    with tarfile.open(model) as tar:
        assert "model.txt" in tar.getnames()


def test_a_job_that_ends_in_time_is_not_cut(make_job):
    job = make_job(hosts=1)
    backend = InProcessBackend({"algo-1": Script(seconds=0.02)})
    record = job.supervisor(backend, max_run=5).run()
    assert record.status is JobStatus.COMPLETED


def test_the_deadline_and_its_reason():
    now = [100.0]
    policy = MaxRunPolicy(3600, clock=lambda: now[0])
    assert not policy.exceeded()
    now[0] = 3700.0
    assert policy.exceeded()
    assert policy.result().reason == (
        "MaxRuntimeExceeded: the job ran longer than max_run=3600 seconds"
    )
