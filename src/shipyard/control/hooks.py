"""What the supervisor does around a job besides deciding its end: one interface, ``Hook``.

Why hooks (issue 36): log pumping, utilization sampling, the hang watch, the environment
phase and the artifacts were woven through the supervisor's loop, which grew against the
class cap with each, and none could be left out to test the rules alone. Each is now a
``Hook`` the supervisor calls at five points, in the order given; a unit test runs the
supervisor with none, or with its own, on the in-process backend.

* ``on_job_start()``: before any instance starts; an ``envphase.Outcome`` when the hook
  ran a phase (a stopped or failed one ends the job), None when it had nothing to do;
* ``on_attempt_start(attempt, handles)``: an attempt's instances were launched;
* ``on_poll(running)``: once per turn of the monitor loop, with the instances still running;
* ``on_attempt_end(attempt, result)``: the attempt ended (its instances stopped);
* ``on_job_end(result)``: before the final status; a line when the hook could not do its
  part and the job must end otherwise (artifacts not saved), else None.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TextIO

from shipyard.backends.api import Backend, InstanceHandle
from shipyard.backends.resources import read_record as read_resources
from shipyard.control import envphase
from shipyard.control.home import Home
from shipyard.control.job_end import JobEnd
from shipyard.control.lifecycle import AttemptKind, Event
from shipyard.control.policies import AttemptResult
from shipyard.control.store import Store
from shipyard.environments import job as framework_envs
from shipyard.observe.logs import LogTailer, print_lines
from shipyard.observe.metrics import MetricExtractor
from shipyard.observe.stacks import SilenceWatch
from shipyard.observe.utilization import Instance, Sampler


class Hook:
    """Every point does nothing unless a hook says otherwise."""

    def on_job_start(self) -> envphase.Outcome | None:
        return None

    def on_attempt_start(self, attempt: int, handles: list[InstanceHandle]) -> None:
        return None

    def on_poll(self, running: list[InstanceHandle]) -> None:
        return None

    def on_attempt_end(self, attempt: int, result: AttemptResult) -> None:
        return None

    def on_job_end(self, result: AttemptResult) -> str | None:
        return None


class LogPump(Hook):
    """The instances' logs: to the attached console (each line tagged with its host),
    through the job's metric definitions into the store, and as activity for the hang
    watch."""

    def __init__(
        self,
        store: Store,
        name: str,
        stream: TextIO | None,
        metrics: MetricExtractor,
        activity: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.stream = stream
        self.metrics = metrics
        self.activity = activity
        self.tailer = LogTailer({})

    def on_attempt_start(self, attempt: int, handles: list[InstanceHandle]) -> None:
        for handle in handles:
            self.tailer.add(handle.host, handle.log_path)

    def on_poll(self, running: list[InstanceHandle]) -> None:
        self.pump()

    def on_attempt_end(self, attempt: int, result: AttemptResult) -> None:
        self.pump(flush=True)

    def pump(self, flush: bool = False) -> None:
        lines = self.tailer.poll(flush=flush)
        if not lines:
            return
        if self.activity is not None:
            self.activity()
        if self.stream is not None:
            print_lines(lines, self.stream)
        self.store.add_metrics(self.name, self.metrics.extract(lines))


class HangWatch(Hook):
    """Stacks of every rank of a job gone silent (observe.stacks), read from this
    machine's processes: the local backend's instances only."""

    def __init__(self, silence: SilenceWatch) -> None:
        self.silence = silence
        self.handles: list[InstanceHandle] = []

    def on_attempt_start(self, attempt: int, handles: list[InstanceHandle]) -> None:
        self.handles = list(handles)

    def on_poll(self, running: list[InstanceHandle]) -> None:
        self.silence.check(
            {h.host: h.pid for h in running}, {h.host: h.log_path for h in self.handles}
        )


def sampled(backend: Backend, job_dir: str, handle: InstanceHandle) -> Instance:
    """What the utilization sampler needs of an instance: its cgroup (the backend's),
    its memory limit and GPUs (the launch's resources record)."""
    cgroup = getattr(backend, "instance_cgroup", lambda h: None)(handle)
    share = (read_resources(job_dir) or {}).get("Instances", {})
    mine = share.get(handle.host, {})
    return Instance(
        handle.host,
        handle.pid,
        os.path.join(job_dir, "instances", handle.host),
        cgroup,
        mine.get("MemoryBytes"),
        tuple(mine.get("Gpus") or ()),
    )


class Utilization(Hook):
    """Per-instance CPU, memory, disk, network and GPU, sampled from this machine."""

    def __init__(self, sampler: Sampler, backend: Backend, job_dir: str) -> None:
        self.sampler = sampler
        self.backend = backend
        self.job_dir = job_dir

    def on_attempt_start(self, attempt: int, handles: list[InstanceHandle]) -> None:
        self.sampler.start([sampled(self.backend, self.job_dir, h) for h in handles], attempt)

    def on_poll(self, running: list[InstanceHandle]) -> None:
        self.sampler.maybe_sample(h.host for h in running)


class EnvironmentPhase(Hook):
    """The job's first phase (control.envphase): the framework environment it asked for,
    built or found before any instance starts; the job Downloading meanwhile."""

    def __init__(
        self,
        home: Home,
        store: Store,
        name: str,
        job_dir: str,
        submit_directory: Callable[[], str],
        say: Callable[[str], None],
        should_stop: Callable[[], bool],
        on_nodes: bool,
    ) -> None:
        self.home = home
        self.store = store
        self.name = name
        self.job_dir = job_dir
        self.submit_directory = submit_directory
        self.say = say
        self.should_stop = should_stop
        self.on_nodes = on_nodes  # Ray: each node builds it

    def on_job_start(self) -> envphase.Outcome | None:
        if envphase.pending(self.job_dir) is None:
            return None
        return envphase.run(
            self.job_dir,
            framework_envs.root(self.home.root),
            self.submit_directory(),
            status=lambda message: self.store.transition(self.name, Event.DOWNLOADING, message),
            log=lambda line: self.say(f"[shipyard] {line}"),
            should_stop=self.should_stop,
            on_nodes=self.on_nodes,
        )


class Artifacts(Hook):
    """At the job's end: the agents' records (the distribution report, lost processes)
    always; the model and output artifacts when ``uploads(kind)`` (a success; max_run)."""

    def __init__(
        self,
        end: JobEnd,
        uploads: Callable[[AttemptKind], bool],
        should_stop: Callable[[], bool],
    ) -> None:
        self.end = end
        self.uploads = uploads
        self.should_stop = should_stop

    def on_job_end(self, result: AttemptResult) -> str | None:
        self.end.collect_agent_records()
        if not self.uploads(result.kind):
            return None
        return self.end.upload(self.should_stop)
