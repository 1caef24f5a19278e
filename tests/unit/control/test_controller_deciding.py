"""The deciding hosts on the real supervisor: when the runner names fewer than all (mpi's
master, TF parameter_server's chief), their success ends the attempt and the instances
that only serve them are stopped, Completed, not Failed."""

from __future__ import annotations

from shipyard.backends.inprocess import InProcessBackend, Script
from shipyard.control.lifecycle import JobStatus


def test_the_masters_success_completes_the_job_and_releases_the_others(make_job):
    job = make_job(hosts=3, runner="mpi")
    backend = InProcessBackend(
        {
            "algo-1": Script(seconds=0.02),
            "algo-2": Script(seconds=None),
            "algo-3": Script(seconds=None),
        }
    )
    record = job.supervisor(backend).run()
    assert record.status is JobStatus.COMPLETED
    assert {host: status for host, (status, _) in job.instances().items()} == {
        "algo-1": "Completed",
        "algo-2": "Completed",
        "algo-3": "Completed",
    }
    assert backend.stops == [(["algo-2", "algo-3"], 0.05)]


def test_with_the_plain_runner_every_instance_decides(make_job):
    job = make_job(hosts=2)
    backend = InProcessBackend(
        {"algo-1": Script(seconds=0.01), "algo-2": Script(exit_code=3, seconds=0.05)}
    )
    record = job.supervisor(backend).run()
    assert record.status is JobStatus.FAILED and record.failure_reason.startswith("[algo-2]")
