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
from shipyard.agent import runners
from shipyard.agent.layout import InstancePaths
from shipyard.backends import get as get_backend
from shipyard.backends.api import Backend, InstanceHandle, LaunchSpec
from shipyard.control import disk_full, envphase, plan
from shipyard.control.home import Home
from shipyard.control.hooks import (
    Artifacts,
    EnvironmentPhase,
    HangWatch,
    Hook,
    LogPump,
    Utilization,
)
from shipyard.control.job_end import JobEnd
from shipyard.control.lifecycle import AttemptKind, Event, InstanceStatus, JobStatus
from shipyard.control.policies import AttemptResult, Policies
from shipyard.control.store import InstanceRecord, JobRecord, Store
from shipyard.control.submitted_plan import SubmittedPlan
from shipyard.errors import BackendError
from shipyard.observe.metrics import MetricExtractor
from shipyard.observe.stacks import SilenceWatch
from shipyard.observe.utilization import Sampler
from shipyard.runtime import safepath

POLL_SECONDS = 0.02


def _job_dir(paths: InstancePaths) -> str:
    """The job's directory above an instance's tree (<job>/instances/algo-k): the root
    below which the supervisor follows no link (the trees are the job's)."""
    return os.path.dirname(os.path.dirname(paths.base))


def failure_time(paths: InstancePaths) -> float | None:
    """When the instance's agent recorded its failure (the root cause is the earliest).
    Read from the instance's tree, which the job writes: no link in it is followed."""
    try:
        return float(safepath.read_text(_job_dir(paths), paths.failure_time_file, 64).strip())
    except (OSError, ValueError):
        return None


def failure_text(paths: InstancePaths) -> str:
    """What the instance's failure file says, read without following a link the job
    planted in its tree ("" when there is none)."""
    try:
        return safepath.read_text(_job_dir(paths), paths.failure_file, 4 * 1024).strip()
    except OSError:
        return ""


def failure_reason(
    paths: InstancePaths, host: str, code: int, verdict: str | None, job_dir: str
) -> str:
    """An instance's FailureReason: its failure file, after the kernel's word first
    (``verdict``: memory or process limit; the script's own error is only the consequence,
    "Killed", a BlockingIOError from fork), within 1024 characters."""
    text = failure_text(paths)
    if not text:
        text = f"instance exited with status {code} without writing a failure reason"
    verdict = verdict or disk_full.verdict(text, paths.base)
    if verdict:
        text = f"{verdict}\n{text}"
    note = envphase.substitution_note(job_dir)
    if note:  # kept whole: the traceback's tail gives way to it
        return f"[{host}] {text}"[: 1024 - len(note) - 1] + "\n" + note
    return f"[{host}] {text}"[:1024]


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
        self.handles: list[InstanceHandle] = []
        self.signalled = False
        self.failed_hosts: set[str] = set()
        if hasattr(self.backend, "should_stop"):  # ends a launch waiting for GPUs
            self.backend.should_stop = self.should_stop
        self.end = JobEnd(home, store, self.record, stream, self._first_log)
        self.plan = SubmittedPlan(os.path.join(self.record.job_dir, "agent.json"))
        config = self.plan.config()
        self.deciding = set(
            runners.deciding_hosts(config.runner, config.runner_options, self.hosts)
        )
        self.hooks: list[Hook] = standard_hooks(self) if hooks is None else list(hooks)

    # -- helpers --------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """A signal reached this process, or a stop was requested through the store."""
        return self.signalled or self.store.get(self.name).stop_requested

    @property
    def hosts(self) -> list[str]:
        return self.spec.hosts

    def paths(self, host: str) -> InstancePaths:
        return InstancePaths(os.path.join(self.record.job_dir, "instances", host))

    def _first_log(self) -> str:
        """algo-1's log: this attempt's once its instances run, the job's first before."""
        handle = next((h for h in self.handles if h.host == self.hosts[0]), None)
        return handle.log_path if handle else self.home.log_path(self.name, self.hosts[0])

    def _failure_reason(self, host: str, code: int) -> str:
        handle = next((h for h in self.handles if h.host == host), None)
        why = getattr(self.backend, "resource_failure", None)
        verdict = why(handle) if why is not None and handle is not None else None
        return failure_reason(self.paths(host), host, code, verdict, self.record.job_dir)

    # -- one attempt ----------------------------------------------------------------------
    def _launch(self, attempt: int) -> None:
        env = dict(os.environ)
        env["SHIPYARD_ATTEMPT"] = str(attempt)
        env["SHIPYARD_MAX_RETRY_ATTEMPTS"] = str(self.spec.max_retry_attempts)
        if self.plan.restore():  # a retry runs the job that was submitted
            self.end.say("[shipyard] agent.json had changed; restored as submitted")
        config_path = os.path.join(self.record.job_dir, "agent.json")
        specs = []
        for host in self.hosts:
            log_path = self.home.log_path(self.name, host)
            if attempt > 1:
                log_path = log_path[:-4] + f".attempt{attempt}.log"
            specs.append(LaunchSpec(self.name, host, config_path, log_path, env))
        self.failed_hosts = set()
        self.handles = self.backend.launch(specs)
        addresses, now = self._addresses(), time.time()
        self.store.record_instances(
            [
                InstanceRecord(
                    self.name,
                    attempt,
                    h.host,
                    addresses.get(h.host),
                    h.pid,
                    InstanceStatus.RUNNING,
                    None,
                    None,
                    h.log_path,
                    now,
                    None,
                )
                for h in self.handles
            ]
        )
        for hook in self.hooks:
            hook.on_attempt_start(attempt, list(self.handles))

    def _addresses(self) -> dict[str, str]:
        subnet = self.record.subnet
        table = plan.addresses(self.hosts, subnet) if subnet else {}
        # a backend that placed instances on real nodes (Ray) reports their addresses
        table.update({h.host: h.address for h in self.handles if h.address})
        return table

    def _finish_instance(
        self,
        handle: InstanceHandle,
        attempt: int,
        code: int,
        status: InstanceStatus,
        reason: str | None,
    ) -> None:
        self.store.record_instance(
            InstanceRecord(
                self.name,
                attempt,
                handle.host,
                self._addresses().get(handle.host),
                handle.pid,
                status,
                code,
                reason,
                handle.log_path,
                None,
                time.time(),
            )
        )

    def _exited(self, handle: InstanceHandle, attempt: int, code: int) -> None:
        """Record an instance that exited by itself: Failed (with its reason) or Completed."""
        if code != 0:
            self.failed_hosts.add(handle.host)
            reason = self._failure_reason(handle.host, code)
            self._finish_instance(handle, attempt, code, InstanceStatus.FAILED, reason)
        else:
            self._finish_instance(handle, attempt, code, InstanceStatus.COMPLETED, None)

    def _monitor(self, attempt: int) -> AttemptResult:
        done: dict[str, int] = {}
        next_stop_check = 0.0
        delay = 0.002
        while True:
            running = [h for h in self.handles if h.host not in done]
            for hook in self.hooks:
                hook.on_poll(running)
            progressed = False
            for handle in running:
                code = self.backend.poll(handle)
                if code is None:
                    continue
                progressed = True
                done[handle.host] = code
                self._exited(handle, attempt, code)
                if code != 0:
                    root = self._root_cause(handle.host, attempt, done)
                    return AttemptResult(AttemptKind.FAILED, self._failure_reason(root, code), root)
            if len(done) == len(self.handles):
                return AttemptResult(AttemptKind.SUCCEEDED)
            if progressed and self.deciding.issubset(done):
                self._release_servers(attempt, done)
                return AttemptResult(AttemptKind.SUCCEEDED)
            now = time.monotonic()
            if self.policies.max_run.exceeded(now):
                return self.policies.max_run.result()
            if self.signalled:
                return AttemptResult(AttemptKind.STOPPED)
            if now >= next_stop_check:
                next_stop_check = now + self.policies.stop.check_seconds
                if self.store.get(self.name).stop_requested:
                    return AttemptResult(AttemptKind.STOPPED)
            time.sleep(delay if not progressed else 0)
            delay = min(delay * 2, POLL_SECONDS)

    def _root_cause(self, seen: str, attempt: int, done: dict[str, int]) -> str:
        """The host whose failure came first (the failure policy's choice): the other
        agents get the policy's settle window to record theirs, then the times they
        recorded are compared (not the order we noticed them)."""
        settle = self.policies.failure.settle_until()
        while time.monotonic() < settle and len(done) < len(self.handles):
            for handle in self.handles:
                if handle.host in done:
                    continue
                code = self.backend.poll(handle)
                if code is not None:
                    done[handle.host] = code
                    self._exited(handle, attempt, code)
            time.sleep(0.01)
        times = {h: failure_time(self.paths(h)) for h in self.hosts}
        root = self.policies.failure.root_cause(seen, times)
        self.failed_hosts.add(root)
        return root

    def _release_servers(self, attempt: int, done: dict[str, int]) -> None:
        """The deciding instances succeeded: stop the ones that only serve them."""
        serving = [h for h in self.handles if h.host not in done]
        if self.stream is not None:
            self.stream.write(
                f"shipyard: {', '.join(sorted(self.deciding))} finished; "
                f"stopping {', '.join(h.host for h in serving)}\n"
            )
        self.backend.stop(serving, grace=self.policies.stop.grace_seconds())
        for handle in serving:
            self._finish_instance(
                handle, attempt, self.backend.poll(handle) or 0, InstanceStatus.COMPLETED, None
            )

    def _stop_instances(self, attempt: int) -> None:
        """The stop policy's stop of every instance still running; one that failed first
        but was seen later keeps its failure, the others are Stopped."""
        running = [h for h in self.handles if self.backend.poll(h) is None]
        self.backend.stop(self.handles, grace=self.policies.stop.grace_seconds())
        for handle in running:
            code = self.backend.poll(handle) or -15
            if handle.host in self.failed_hosts:  # failed first, seen later
                reason = self._failure_reason(handle.host, code)
                self._finish_instance(handle, attempt, code, InstanceStatus.FAILED, reason)
            else:
                self._finish_instance(handle, attempt, code, InstanceStatus.STOPPED, None)

    def _attempt_ended(self, attempt: int, result: AttemptResult) -> None:
        for hook in self.hooks:
            hook.on_attempt_end(attempt, result)

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
                result = self._monitor(attempt)
                if result.kind is not AttemptKind.SUCCEEDED:
                    self._stop_instances(attempt)
                self._attempt_ended(attempt, result)
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
            self._stop_instances(attempt)
            self._attempt_ended(attempt, AttemptResult(AttemptKind.STOPPED))
            self._safe_transition(Event.STOP_REQUESTED, "Stop requested (interrupted)")
            self._safe_transition(Event.STOPPED, "Training job stopped")
            raise
        except BaseException as exc:
            self._stop_instances(attempt)
            self._safe_transition(
                Event.FAILED,
                "Internal error",
                f"InternalServerError: {type(exc).__name__}: {exc}"[:1024],
            )
            raise

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
