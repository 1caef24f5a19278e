"""The job supervisor: launches the instances, watches them, decides how the job ends.

Runs in the foreground of ``fit(wait=True)`` (no extra process: launch overhead
matters) or as a detached process (``python -m shipyard.control.supervisor``) for
``wait=False`` and ``shipyard train --detach``. Either way it is the only writer of
the job's status after submission, and the only place that decides:

* the first instance to fail is the root cause; every other instance is stopped;
* the job succeeds when every deciding instance has succeeded (all of them, unless the
  runner names fewer: TF parameter_server's chief, mpi's master); the rest are then
  stopped, since they only serve (TF worker/ps servers, mpi's waiting hosts);
* ``max_run`` reached: instances stopped, artifacts kept, Stopped/MaxRuntimeExceeded;
* a stop request (``shipyard stop``, Ctrl-C, SIGTERM): Stopped;
* with ``max_retry_attempts`` a failed attempt restarts every instance.

These rules are injected policies (``control/policies.py``); what happens besides (the
environment phase, logs, utilization, the hang watch, artifacts) is hooks
(``control/hooks.py``); one attempt's launch, watch and stop is ``control/attempt.py``.
This module keeps the job's order: environment, attempts, retries, the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from shipyard import instance_types
from shipyard.backends import get as get_backend
from shipyard.backends.api import Backend
from shipyard.control import envphase
from shipyard.control.attempt import Attempt, JobContext
from shipyard.control.home import Home
from shipyard.control.hooks import (
    Artifacts,
    EnvironmentPhase,
    HangWatch,
    Hook,
    LogPump,
    Utilization,
)
from shipyard.control.job_disks import JobDisks
from shipyard.control.job_end import JobEnd
from shipyard.control.lifecycle import AttemptKind, Event, JobStatus
from shipyard.control.policies import AttemptResult, Policies
from shipyard.control.store import JobRecord, Store
from shipyard.control.submitted_plan import SubmittedPlan
from shipyard.errors import BackendError
from shipyard.observe.metrics import MetricExtractor
from shipyard.observe.stacks import SilenceWatch
from shipyard.observe.utilization import Sampler


class StopRequested(Exception):
    """Raised inside the monitor loop by a signal handler of a detached supervisor."""


def standard_hooks(sup: JobSupervisor) -> list[Hook]:
    """The hooks every real job runs with, in their calling order: the environment phase,
    the log pump, then (local backend: this machine's processes) utilization and the hang
    watch, and the artifacts last."""
    record, spec = sup.record, sup.spec
    local = record.backend == "local"
    silence = SilenceWatch.from_environment(dict(spec.environment)) if local else None
    metrics = MetricExtractor(m.model_dump() for m in spec.metric_definitions)
    hooks: list[Hook] = [
        EnvironmentPhase(
            sup.home,
            sup.store,
            sup.name,
            record.job_dir,
            lambda: sup.plan.config().submit_directory,
            sup.end.say,
            sup.should_stop,
            on_nodes=not local,
        ),
        LogPump(sup.store, sup.name, sup.stream, metrics, silence.activity if silence else None),
    ]
    if local:
        sampler = Sampler(record.job_dir, instance_types.machine_memory())
        hooks.append(Utilization(sampler, sup.backend, record.job_dir))
    if silence is not None:
        hooks.append(HangWatch(silence))
    hooks.append(Artifacts(sup.end, sup.policies.uploads, sup.should_stop))
    return hooks


class JobSupervisor:
    """Runs one job: its attempts on a backend, decided by ``policies`` (control.policies;
    the spec's own by default), with ``hooks`` (control.hooks; ``standard_hooks`` by
    default) called around them. Every status change goes through the store's
    ``transition``, i.e. the pure ``lifecycle.step``."""

    def __init__(
        self,
        home: Home,
        store: Store,
        name: str,
        stream: TextIO | None = None,
        backend: Backend | None = None,
        policies: Policies | None = None,
        hooks: Sequence[Hook] | None = None,
    ) -> None:
        self.home = home
        self.store = store
        self.name = name
        self.stream = stream
        self.record = store.get(name)
        self.spec = self.record.spec
        self.backend = backend or get_backend(self.record.backend)
        self.policies = policies or Policies.for_spec(self.spec)
        self.signalled = False
        self.current: Attempt | None = None  # the attempt whose instances last launched
        if hasattr(self.backend, "should_stop"):  # ends a launch waiting for GPUs
            self.backend.should_stop = self.should_stop
        self.end = JobEnd(home, store, self.record, stream, self._first_log)
        # each instance's /opt/ml a disk of VolumeSizeInGB, from the first launch to the end
        self.disks = JobDisks(
            self.record.job_dir,
            self.hosts,
            self.spec.volume_size_gb,
            getattr(self.backend, "name", "unknown"),
            self.end.say,
        )
        self.plan = SubmittedPlan(os.path.join(self.record.job_dir, "agent.json"))
        config = self.plan.config()
        self.deciding = set(config.deciding_hosts())
        self.hooks: list[Hook] = standard_hooks(self) if hooks is None else list(hooks)
        self.job = JobContext(
            home,
            store,
            self.record,
            self.backend,
            self.policies,
            self.hooks,  # the same list: a hook added before run() is called
            self.deciding,
            stream,
            lambda: self.signalled,
        )

    # -- helpers --------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """A signal reached this process, or a stop was requested through the store."""
        return self.signalled or self.store.get(self.name).stop_requested

    @property
    def hosts(self) -> list[str]:
        return self.spec.hosts

    def _first_log(self) -> str:
        """algo-1's log: this attempt's once its instances run, the job's first before."""
        handles = self.current.handles if self.current is not None else []
        handle = next((h for h in handles if h.host == self.hosts[0]), None)
        return handle.log_path if handle else self.home.log_path(self.name, self.hosts[0])

    def _launch(self, number: int) -> None:
        """Start attempt ``number``: the submitted plan put back first (a retry runs the
        job that was submitted), then its instances."""
        env = dict(os.environ)
        env["SHIPYARD_ATTEMPT"] = str(number)
        env["SHIPYARD_MAX_RETRY_ATTEMPTS"] = str(self.spec.max_retry_attempts)
        if self.plan.restore():
            self.end.say("[shipyard] agent.json had changed; restored as submitted")
        # current before its launch: an error after the backend started the instances
        # (recording them) still stops them
        self.current = Attempt(self.job, number)
        self.disks.ensure()
        self.current.launch(env)

    def _stop_instances(self) -> None:
        if self.current is not None:
            self.current.stop()

    # -- the whole job --------------------------------------------------------------------
    def run(self) -> JobRecord:
        attempt = self.record.attempt
        try:
            ended = self._start()
            if ended is not None:
                return ended
            while True:
                started = time.time()
                self.store.record_attempt(self.name, attempt, started)
                try:
                    self._launch(attempt)
                except BackendError as exc:
                    ended = self._launch_refused(exc, attempt, started)
                    if ended is None:
                        raise
                    return ended
                self.store.transition(
                    self.name,
                    Event.TRAINING,
                    f"Training with {len(self.hosts)} instance(s), attempt {attempt}",
                )
                assert self.current is not None
                result = self.current.monitor()
                if result.kind is not AttemptKind.SUCCEEDED:
                    self.current.stop()
                self.current.end(result)
                self.store.record_attempt(self.name, attempt, started, time.time(), result.reason)
                if not self.policies.retry.should_retry(result, attempt):
                    return self._conclude(result)
                attempt += 1
                self.store.update(self.name, attempt=attempt)
                self.store.transition(
                    self.name,
                    Event.RESTARTING,
                    f"Attempt {attempt - 1} failed on {result.host}; "
                    f"restarting all instances (attempt {attempt})",
                )
        except KeyboardInterrupt:
            self._stop_instances()
            self.disks.release()
            if self.current is not None:
                self.current.end(AttemptResult(AttemptKind.STOPPED))
            self._safe_transition(Event.STOP_REQUESTED, "Stop requested (interrupted)")
            self._safe_transition(Event.STOPPED, "Training job stopped")
            raise
        except BaseException as exc:
            self._stop_instances()
            self.disks.release()
            self._safe_transition(
                Event.FAILED,
                "Internal error",
                f"InternalServerError: {type(exc).__name__}: {exc}"[:1024],
            )
            raise
        finally:  # a launch refused with its disks made
            self.disks.release()

    def _start(self) -> JobRecord | None:
        """The hooks' first phase (the framework environment), before any instance
        starts; the record when it ended the job."""
        for hook in self.hooks:
            outcome = hook.on_job_start()
            if outcome is None:
                continue
            if outcome.stopped:
                return self._conclude(AttemptResult(AttemptKind.STOPPED))
            if outcome.failure:
                return self.store.transition(
                    self.name,
                    Event.FAILED,
                    "Framework environment could not be prepared",
                    failure_reason=outcome.failure,
                )
            self.plan = SubmittedPlan(self.plan.path)  # the phase's plan (no instance ran yet)
        return None

    def _launch_refused(self, exc: BackendError, attempt: int, started: float) -> JobRecord | None:
        """The job's end when a launch failed for a known reason (a Ray node could not
        build the environment; a stop while it waited for GPUs), else None."""
        refused = envphase.node_failure(exc)
        if refused is not None:
            self.store.record_attempt(self.name, attempt, started, time.time(), refused)
            return self.store.transition(
                self.name,
                Event.FAILED,
                "Framework environment could not be prepared",
                failure_reason=refused,
            )
        if not self.should_stop():
            return None
        self.store.record_attempt(self.name, attempt, started, time.time(), None)
        return self._conclude(AttemptResult(AttemptKind.STOPPED))

    def _safe_transition(self, event: Event, message: str, reason: str | None = None) -> None:
        try:
            if not self.store.get(self.name).terminal:
                self.store.transition(self.name, event, message, failure_reason=reason)
        except Exception:  # noqa: BLE001 - the original error matters more than this bookkeeping
            pass

    def _conclude(self, result: AttemptResult) -> JobRecord:
        """The job's final status; the hooks' end first (the artifacts, uploaded when the
        policies keep them: a line from a hook that could not do its part ends the job
        otherwise)."""
        if result.kind is AttemptKind.SUCCEEDED:
            self.store.transition(self.name, Event.UPLOADING, "Uploading generated training model")
        unsaved = None
        for hook in self.hooks:
            unsaved = hook.on_job_end(result) or unsaved
        self.disks.release()  # after the last upload, before the job is seen ended
        if unsaved is not None:
            return self.end.not_saved(unsaved, self.should_stop())
        if result.kind is AttemptKind.SUCCEEDED:
            return self.store.transition(self.name, Event.SUCCEEDED, "Training job completed")
        if result.kind is AttemptKind.FAILED:
            return self.store.transition(
                self.name, Event.FAILED, "Training job failed", failure_reason=result.reason
            )
        if result.kind is AttemptKind.MAX_RUNTIME:
            return self.store.transition(
                self.name, Event.MAX_RUNTIME, result.reason or "", failure_reason=result.reason
            )
        self.store.transition(self.name, Event.STOP_REQUESTED, "Stop requested")
        return self.store.transition(self.name, Event.STOPPED, "Training job stopped")


def main(argv: list[str] | None = None) -> int:
    """Detached supervisor: ``python -m shipyard.control.supervisor --home H --job NAME``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", required=True)
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    home = Home(args.home)
    store = Store(home.db_path)
    sup = JobSupervisor(home, store, args.job, stream=None)

    def on_signal(signum, _frame):
        sup.signalled = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    record = sup.run()
    return 0 if record.status is JobStatus.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
