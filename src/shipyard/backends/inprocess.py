"""An in-process backend: each "instance" is a thread playing a script, no process started.

Why (issue 36): the supervisor's rules (retry, the root cause, stop, max_run, the
environment phase) were tested only by launching real jobs, seconds each and sensitive to
a loaded machine's timing. This backend keeps the ``Backend`` seam (launch, poll, stop,
logs) and plays, per host and attempt, what an agent would leave: log lines in the
instance's log file, a model file, and on failure the agent's records (``output/failure``,
the failure time the root cause is chosen by) and exit status, at scripted times; a stop
is SIGTERM-like (the script ends at once with -15) unless the script ignores it, then
it is killed after the grace (-9). As ``shipyard.ps``' in-process transport does for the
shards, so the supervisor itself runs unchanged, in milliseconds.

It ships (not under tests/) so that anyone extending the supervisor can drive it without
a sandbox or a framework; it is not among ``backends.get``'s names, so no job can pick it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shipyard.backends.api import InstanceHandle, LaunchSpec
from shipyard.jobplan.layout import InstancePaths

SIGTERM_STATUS = -15
SIGKILL_STATUS = -9


@dataclass(frozen=True)
class Script:
    """What one instance does in one attempt.

    ``exit_code`` after ``seconds`` (None: runs until stopped); ``failure``: the text its
    agent writes to ``output/failure``; ``failed_at``: when (seconds after launch) the
    agent records the failure, default the exit itself (a later exit with an earlier
    failure time is an agent slow to exit); ``logs``: lines written at start;
    ``ignores_stop``: only a kill after the grace ends it; ``model``: files written under
    ``model/`` (name -> text)."""

    exit_code: int = 0
    seconds: float | None = 0.0
    failure: str | None = None
    failed_at: float | None = None
    logs: tuple[str, ...] = ()
    ignores_stop: bool = False
    model: Mapping[str, str] = field(default_factory=dict)


Scripts = Mapping[str, "Script | Sequence[Script]"]


class _Instance:
    """One thread of one attempt of one host."""

    def __init__(self, spec: LaunchSpec, script: Script) -> None:
        self.spec = spec
        self.script = script
        self.paths = InstancePaths(
            os.path.join(os.path.dirname(spec.config_path), "instances", spec.host)
        )
        self.code: int | None = None
        self.term = threading.Event()
        self.kill = threading.Event()
        self.launched = time.time()
        self.thread = threading.Thread(
            target=self._play, name=f"inprocess-{spec.host}", daemon=True
        )

    def _play(self) -> None:
        script = self.script
        for line in script.logs:
            self._log(line)
        for name, text in script.model.items():
            self._write(os.path.join(self.paths.model, name), text)
        deadline = None if script.seconds is None else time.monotonic() + script.seconds
        while deadline is None or time.monotonic() < deadline:
            # SIGTERM first: it came before the kill, even when this thread is scheduled only
            # after both (a loaded machine); only an instance deaf to it dies of the kill
            if self.term.is_set() and not script.ignores_stop:
                self.code = SIGTERM_STATUS
                return
            if self.kill.is_set():
                self.code = SIGKILL_STATUS
                return
            wait = 0.005 if deadline is None else min(0.005, max(0.0, deadline - time.monotonic()))
            time.sleep(wait)
        if script.exit_code != 0:
            failed_at = self.launched + (
                script.failed_at if script.failed_at is not None else (script.seconds or 0.0)
            )
            self._write(self.paths.failure_file, script.failure or "")
            self._write(self.paths.failure_time_file, repr(failed_at))
        self.code = script.exit_code

    def _log(self, line: str) -> None:
        with open(self.spec.log_path, "a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")

    @staticmethod
    def _write(path: str, text: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


class InProcessBackend:
    """The Backend protocol on threads. ``scripts`` maps a host to its Script, or to one
    per attempt (the last repeats); a host not named runs ``Script()`` (exits 0 at once).
    ``launches`` counts calls to launch, ``stops`` records each stop's hosts and grace."""

    name = "inprocess"

    def __init__(self, scripts: Scripts | None = None) -> None:
        self.scripts = dict(scripts or {})
        self.launches = 0
        self.stops: list[tuple[list[str], float]] = []
        self._instances: dict[int, _Instance] = {}
        self._next_pid = 1

    def script(self, host: str, attempt: int) -> Script:
        """What ``host`` does in attempt ``attempt`` (1-based)."""
        given = self.scripts.get(host, Script())
        if isinstance(given, Script):
            return given
        if not given:
            return Script()
        return given[min(attempt, len(given)) - 1]

    def launch(self, specs: list[LaunchSpec]) -> list[InstanceHandle]:
        self.launches += 1
        handles = []
        for spec in specs:
            attempt = int(spec.env.get("SHIPYARD_ATTEMPT", "1"))
            instance = _Instance(spec, self.script(spec.host, attempt))
            for stale in (instance.paths.failure_file, instance.paths.failure_time_file):
                if os.path.exists(stale):  # a retried attempt starts clean, as an agent does
                    os.remove(stale)
            os.makedirs(os.path.dirname(spec.log_path), exist_ok=True)
            pid, self._next_pid = self._next_pid, self._next_pid + 1
            self._instances[pid] = instance
            handles.append(InstanceHandle(spec.host, pid, spec.log_path))
        for handle in handles:
            self._instances[handle.pid].thread.start()
        return handles

    def poll(self, handle: InstanceHandle) -> int | None:
        instance = self._instances[handle.pid]
        return None if instance.thread.is_alive() else instance.code

    def stop(self, handles: list[InstanceHandle], grace: float) -> None:
        self.stops.append(([h.host for h in handles], grace))
        instances = [self._instances[h.pid] for h in handles]
        for instance in instances:
            instance.term.set()
        deadline = time.monotonic() + grace
        for instance in instances:
            instance.thread.join(max(0.0, deadline - time.monotonic()))
        for instance in instances:
            instance.kill.set()
            instance.thread.join()

    def logs(self, handle: InstanceHandle) -> str:
        """The instance's log so far."""
        try:
            with open(handle.log_path, encoding="utf-8") as fh:
                return fh.read()
        except FileNotFoundError:
            return ""
