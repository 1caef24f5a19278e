"""One attempt of a job: its instances launched, watched until a policy ends the attempt,
stopped; every instance's end recorded in the store.

Split from the supervisor (issue 36) because an attempt has a life of its own (its
handles, which hosts are done, which failed) that the job's loop only starts and reads:
the supervisor keeps the job's order (environment, attempts, retries, the end), this
module what happens between one launch and its stop. The readers of an agent's records
(its failure file and failure time) live here, beside their one user.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from shipyard.backends.api import Backend, InstanceHandle, LaunchSpec
from shipyard.control import disk_full, envphase, plan
from shipyard.control.exits import ExitWatch
from shipyard.control.home import Home
from shipyard.control.hooks import Hook
from shipyard.control.lifecycle import AttemptKind, InstanceStatus
from shipyard.control.policies import AttemptResult, Policies
from shipyard.control.store import InstanceRecord, JobRecord, Store
from shipyard.jobplan.layout import InstancePaths
from shipyard.runtime import safepath

POLL_SECONDS = 0.02  # between two looks when an instance's exit is no event (control.exits)
# when every running instance's exit wakes the wait: the timeout only paces the hooks'
# log pump and the policies' checks (a stop request, max_run, a signal)
WATCHED_POLL_SECONDS = 0.1


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


@dataclass
class JobContext:
    """What every attempt of one job shares: where it is recorded, where it runs, the
    rules it ends by and the hooks it calls."""

    home: Home
    store: Store
    record: JobRecord
    backend: Backend
    policies: Policies
    hooks: list[Hook]
    deciding: set[str]
    stream: TextIO | None
    signalled: Callable[[], bool]

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def hosts(self) -> list[str]:
        return self.record.spec.hosts

    def paths(self, host: str) -> InstancePaths:
        return InstancePaths(os.path.join(self.record.job_dir, "instances", host))


class Attempt:
    """Attempt ``number`` of the job: ``launch``, ``monitor`` until a policy ends it,
    ``stop`` what still runs, ``end`` (the hooks)."""

    def __init__(self, job: JobContext, number: int) -> None:
        self.job = job
        self.number = number
        self.handles: list[InstanceHandle] = []
        self.failed_hosts: set[str] = set()

    def _failure_reason(self, host: str, code: int) -> str:
        handle = next((h for h in self.handles if h.host == host), None)
        why = getattr(self.job.backend, "resource_failure", None)
        verdict = why(handle) if why is not None and handle is not None else None
        return failure_reason(self.job.paths(host), host, code, verdict, self.job.record.job_dir)

    def launch(self, env: dict[str, str]) -> None:
        """Start every instance (the backend's all or none), record them Running, and
        call the hooks' ``on_attempt_start``."""
        attempt = self.number
        config_path = os.path.join(self.job.record.job_dir, "agent.json")
        specs = []
        for host in self.job.hosts:
            log_path = self.job.home.log_path(self.job.name, host)
            if attempt > 1:
                log_path = log_path[:-4] + f".attempt{attempt}.log"
            specs.append(LaunchSpec(self.job.name, host, config_path, log_path, env))
        self.failed_hosts = set()
        self.handles = self.job.backend.launch(specs)
        addresses, now = self._addresses(), time.time()
        self.job.store.record_instances(
            [
                InstanceRecord(
                    self.job.name,
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
        for hook in self.job.hooks:
            hook.on_attempt_start(self.number, list(self.handles))

    def _addresses(self) -> dict[str, str]:
        subnet = self.job.record.subnet
        table = plan.addresses(self.job.hosts, subnet) if subnet else {}
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
        self.job.store.record_instance(
            InstanceRecord(
                self.job.name,
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

    def monitor(self) -> AttemptResult:
        """Watch until every instance (or every deciding one) succeeded, one failed, or a
        policy (max_run, a stop) ended the attempt. Between two looks it waits on the
        instances' exits where it can (control.exits): an exit is seen when it happens."""
        with ExitWatch(self.handles) as watch:
            return self._watch(watch)

    def _watch(self, watch: ExitWatch) -> AttemptResult:
        attempt = self.number
        done: dict[str, int] = {}
        woke: set[str] = set()
        next_stop_check = 0.0
        delay = 0.002
        while True:
            running = [h for h in self.handles if h.host not in done]
            codes: dict[str, int] = {}
            for handle in running:
                code = self.job.backend.poll(handle)
                if code is not None:
                    codes[handle.host] = code
                elif handle.host in woke:  # its fd woke us, yet it runs: not its exit
                    watch.forget(handle.host)
            # the hooks before the exits are handled (the log pump reads what an instance
            # wrote before it ended, ahead of stopping the others) and with the instances
            # still running only: woken by an exit, the utilization sampler read the
            # exited instance as running (0 bytes of memory, CI's utilization test)
            for hook in self.job.hooks:
                hook.on_poll([h for h in running if h.host not in codes])
            progressed = False
            for handle in running:
                if handle.host not in codes:
                    continue
                code = codes[handle.host]
                progressed = True
                done[handle.host] = code
                watch.forget(handle.host)
                self._exited(handle, attempt, code)
                if code != 0:
                    root = self._root_cause(handle.host, attempt, done)
                    return AttemptResult(AttemptKind.FAILED, self._failure_reason(root, code), root)
            if len(done) == len(self.handles):
                return AttemptResult(AttemptKind.SUCCEEDED)
            if progressed and self.job.deciding.issubset(done):
                self._release_servers(attempt, done)
                return AttemptResult(AttemptKind.SUCCEEDED)
            now = time.monotonic()
            if self.job.policies.max_run.exceeded(now):
                return self.job.policies.max_run.result()
            if self.job.signalled():
                return AttemptResult(AttemptKind.STOPPED)
            if now >= next_stop_check:
                next_stop_check = now + self.job.policies.stop.check_seconds
                if self.job.store.get(self.job.name).stop_requested:
                    return AttemptResult(AttemptKind.STOPPED)
            waiting = [h.host for h in self.handles if h.host not in done]
            # every exit an event: the timeout only paces the hooks and the policies
            ceiling = WATCHED_POLL_SECONDS if watch.covers(waiting) else POLL_SECONDS
            woke = watch.wait(0 if progressed else min(delay, ceiling), waiting)
            delay = min(delay * 2, ceiling)

    def _root_cause(self, seen: str, attempt: int, done: dict[str, int]) -> str:
        """The host whose failure came first (the failure policy's choice): the other
        agents get the policy's settle window to record theirs, then the times they
        recorded are compared (not the order we noticed them)."""
        settle = self.job.policies.failure.settle_until()
        while time.monotonic() < settle and len(done) < len(self.handles):
            for handle in self.handles:
                if handle.host in done:
                    continue
                code = self.job.backend.poll(handle)
                if code is not None:
                    done[handle.host] = code
                    self._exited(handle, attempt, code)
            time.sleep(0.01)
        times = {h: failure_time(self.job.paths(h)) for h in self.job.hosts}
        root = self.job.policies.failure.root_cause(seen, times)
        self.failed_hosts.add(root)
        return root

    def _release_servers(self, attempt: int, done: dict[str, int]) -> None:
        """The deciding instances succeeded: stop the ones that only serve them."""
        serving = [h for h in self.handles if h.host not in done]
        if self.job.stream is not None:
            self.job.stream.write(
                f"shipyard: {', '.join(sorted(self.job.deciding))} finished; "
                f"stopping {', '.join(h.host for h in serving)}\n"
            )
        self.job.backend.stop(serving, grace=self.job.policies.stop.grace_seconds())
        for handle in serving:
            self._finish_instance(
                handle, attempt, self.job.backend.poll(handle) or 0, InstanceStatus.COMPLETED, None
            )

    def stop(self) -> None:
        """The stop policy's stop of every instance still running; one that failed first
        but was seen later keeps its failure, the others are Stopped."""
        attempt = self.number
        running = [h for h in self.handles if self.job.backend.poll(h) is None]
        self.job.backend.stop(self.handles, grace=self.job.policies.stop.grace_seconds())
        for handle in running:
            code = self.job.backend.poll(handle) or -15
            if handle.host in self.failed_hosts:  # failed first, seen later
                reason = self._failure_reason(handle.host, code)
                self._finish_instance(handle, attempt, code, InstanceStatus.FAILED, reason)
            else:
                self._finish_instance(handle, attempt, code, InstanceStatus.STOPPED, None)

    def end(self, result: AttemptResult) -> None:
        """The hooks' ``on_attempt_end`` (the logs flushed)."""
        for hook in self.job.hooks:
            hook.on_attempt_end(self.number, result)
