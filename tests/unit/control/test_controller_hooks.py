"""The supervisor's hooks on the in-process backend: the log pump (console, metrics), and
the order of the five calls every hook gets."""

from __future__ import annotations

import io

import pytest

from shipyard.backends.inprocess import InProcessBackend, Script
from shipyard.control.hooks import Hook
from shipyard.control.lifecycle import JobStatus

FAIL = Script(exit_code=1, seconds=0.01, failure="boom")
OK = Script(seconds=0.01, logs=("epoch 1 loss=0.50", "epoch 2 loss=0.25"))


def test_the_log_pump_prints_each_line_with_its_host_and_extracts_metrics(make_job):
    job = make_job(hosts=1, metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}])
    console = io.StringIO()
    record = job.supervisor(InProcessBackend({"algo-1": OK}), stream=console).run()
    assert record.status is JobStatus.COMPLETED
    assert "algo-1" in console.getvalue() and "epoch 2 loss=0.25" in console.getvalue()
    assert [m["value"] for m in job.store.metrics(job.name)] == [0.5, 0.25]


class Calls(Hook):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_job_start(self):
        self.calls.append("job_start")

    def on_attempt_start(self, attempt, handles):
        self.calls.append(f"attempt_start {attempt} {[h.host for h in handles]}")

    def on_poll(self, running):
        if not self.calls[-1].startswith("poll"):
            self.calls.append("poll")

    def on_attempt_end(self, attempt, result):
        self.calls.append(f"attempt_end {attempt} {result.kind}")

    def on_job_end(self, result):
        self.calls.append(f"job_end {result.kind}")


def test_every_hook_is_called_at_the_five_points_in_order(make_job):
    job = make_job(hosts=1)
    calls = Calls()
    backend = InProcessBackend({"algo-1": [FAIL, Script(seconds=0.01)]})
    record = job.supervisor(backend, retries=1, hooks=[calls]).run()
    assert record.status is JobStatus.COMPLETED
    assert calls.calls == [
        "job_start",
        "attempt_start 1 ['algo-1']",
        "poll",
        "attempt_end 1 failed",
        "attempt_start 2 ['algo-1']",
        "poll",
        "attempt_end 2 succeeded",
        "job_end succeeded",
    ]


def test_a_hook_that_could_not_do_its_part_ends_the_job_failed(make_job):
    job = make_job(hosts=1)

    class Unsaved(Hook):
        def on_job_end(self, result):
            return "the model artifacts could not be saved: disk full"

    record = job.supervisor(InProcessBackend(), hooks=[Unsaved()]).run()
    assert record.status is JobStatus.FAILED
    assert record.failure_reason == "the model artifacts could not be saved: disk full"


def test_an_error_after_the_launch_stops_the_instances_and_fails_the_job(make_job):
    job = make_job(hosts=2)

    class Broken(Hook):
        def on_attempt_start(self, attempt, handles):
            raise RuntimeError("sampler exploded")

    backend = InProcessBackend({"algo-1": Script(seconds=None), "algo-2": Script(seconds=None)})
    sup = job.supervisor(backend, hooks=[Broken()])
    with pytest.raises(RuntimeError, match="sampler exploded"):  # raised after the bookkeeping
        sup.run()
    record = job.store.get(job.name)
    assert record.status is JobStatus.FAILED
    assert record.failure_reason == "InternalServerError: RuntimeError: sampler exploded"
    assert job.instances() == {"algo-1": ("Stopped", -15), "algo-2": ("Stopped", -15)}
    assert all(backend.poll(h) is not None for h in sup.current.handles)  # no instance left


def test_hooks_are_polled_with_the_instances_still_running_only(make_job):
    """Woken by an instance's exit, the monitor handed the hooks the exited instance as
    running: the utilization sampler read it then (0 bytes of memory, CI's utilization
    test). The hooks now see the instances the backend still reports running."""
    job = make_job(hosts=2)
    backend = InProcessBackend({"algo-1": Script(seconds=0.01), "algo-2": Script(seconds=0.3)})
    ended: list[str] = []

    class Running(Hook):
        def on_poll(self, running):
            ended.extend(h.host for h in running if backend.poll(h) is not None)

    record = job.supervisor(backend, hooks=[Running()]).run()
    assert record.status is JobStatus.COMPLETED
    assert ended == []
