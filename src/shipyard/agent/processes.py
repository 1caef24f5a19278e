"""Supervising an instance's processes: start, watch, stop; nothing may outlive them.

Children run in the agent's process group (the backend made the agent a session
leader) and get PR_SET_PDEATHSIG (armed by util-linux ``setpriv`` in the child, not by a
preexec_fn, which is unsafe once the agent has threads), so they die with the agent
even if it is SIGKILLed.
The agent is a child subreaper, so even descendants that daemonize (new session,
parent exited) stay its descendants; when the agent ends, every remaining descendant
is terminated, then killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from shipyard.jobplan.runner import ProcessSpec
from shipyard.runtime.lifeline import become_subreaper, death_signal_argv
from shipyard.runtime.reaping import terminate_descendants


@dataclass
class Outcome:
    ok: bool
    exit_code: int
    failed: ProcessSpec | None = None
    stopped: bool = False
    at: float = field(default_factory=time.time)  # when the deciding process ended


class Supervisor:
    """Runs the planned processes until the instance's result is known."""

    def __init__(
        self,
        specs: list[ProcessSpec],
        grace: float = 5.0,
        log=print,
        lost_file: str | None = None,
        on_failure: Callable[[Outcome], None] | None = None,
        on_failed_exit: Callable[[float], None] | None = None,
        spare: Collection[int] = (),
        spawn: Callable[[Callable[[], Any]], Any] = lambda start: start(),
    ) -> None:
        self.specs = specs
        # runs each process start: the sandbox's starts it in the instance's PID namespace
        self.spawn = spawn
        self.spare = spare  # descendants the teardown leaves running (terminate_descendants)
        self.grace = grace
        self.log = log
        self.lost_file = lost_file
        self.lost: list[tuple[ProcessSpec, int]] = []
        self.stop_signal: int | None = None
        self.procs: list[tuple[ProcessSpec, subprocess.Popen]] = []
        self.on_failure = on_failure  # called before teardown: the failure is recorded first
        self.exited_at: dict[int, float] = {}
        # called from the exit watcher, at once, when a critical process ends badly: the
        # time is out before the poll loop even notices (the control plane compares times)
        self.on_failed_exit = on_failed_exit
        # set by each exit watcher: the poll loop wakes at an exit, not at its next tick
        # (up to 50 ms later, on every instance's way to the end of the job)
        self._exited = threading.Event()

    def request_stop(self, signum: int, _frame=None) -> None:
        self.stop_signal = signum

    def start(self) -> None:
        become_subreaper()
        for spec in self.specs:
            env = dict(spec.env) if spec.env is not None else dict(os.environ)
            env["SHIPYARD_PROCESS_NAME"] = spec.name  # labels `shipyard stacks` output
            argv = death_signal_argv(spec.argv)
            proc = self.spawn(
                partial(subprocess.Popen, argv, env=env, cwd=spec.cwd, close_fds=True)
            )
            self.procs.append((spec, proc))
            threading.Thread(
                target=self._note_exit, args=(proc.pid, spec.critical), daemon=True
            ).start()

    def _note_exit(self, pid: int, critical: bool) -> None:
        """The moment a process ends, to the millisecond, whatever the poll interval: the
        earliest failure across instances is the job's root cause (torch elastic's rule).
        WNOWAIT leaves the child for Popen to reap."""
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except (ChildProcessError, OSError):
            return
        at = self.exited_at[pid] = time.time()
        self._exited.set()
        failed = info is not None and (info.si_code != os.CLD_EXITED or info.si_status != 0)
        if failed and critical and self.on_failed_exit is not None:
            try:
                self.on_failed_exit(at)
            except OSError:
                pass

    def run(self) -> Outcome:
        self.start()
        delay = 0.002
        try:
            while True:
                self._exited.clear()  # before polling: an exit from now on wakes the wait
                if self.stop_signal is not None:
                    return Outcome(ok=False, exit_code=128 + self.stop_signal, stopped=True)
                mains_running = False
                for spec, proc in list(self.procs):
                    code = proc.poll()
                    if code is None:
                        mains_running = mains_running or spec.role == "main"
                        continue
                    if code != 0 and not spec.critical:
                        self._record_lost(spec, proc, code)
                        continue
                    if code != 0:
                        outcome = Outcome(ok=False, exit_code=code, failed=spec)
                        outcome.at = self.exited_at.get(proc.pid, outcome.at)
                        if self.on_failure is not None:
                            self.on_failure(outcome)
                        return outcome
                if not mains_running:
                    return Outcome(ok=True, exit_code=0)
                self._exited.wait(delay)
                delay = min(delay * 2, 0.05)
        finally:
            terminate_descendants(self.grace, self.spare)

    def _record_lost(self, spec: ProcessSpec, proc: subprocess.Popen, code: int) -> None:
        """A non-critical process died: note it once and carry on without it."""
        self.procs.remove((spec, proc))
        self.lost.append((spec, code))
        self.log(
            f"{spec.name} exited with status {code}; it is not critical to this "
            "instance, which carries on without it"
        )
        if self.lost_file:
            os.makedirs(os.path.dirname(self.lost_file), exist_ok=True)
            with open(self.lost_file, "a", encoding="utf-8") as fh:
                fh.write(
                    json.dumps({"process": spec.name, "exit_code": code, "time": time.time()})
                    + "\n"
                )
