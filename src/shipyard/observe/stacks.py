"""Stack dumps of every process of every instance of a running job (py-spy).

Each instance's agent is a process on this machine (local backend); every process
below it is dumped with ``py-spy dump --native`` (Python frames, plus native frames
where py-spy can read them), and labelled by the host it works for, its rank and its
role:

* host: the process's ``SM_CURRENT_HOST`` (an MPI rank runs under algo-1's mpirun but
  works for its own instance), else the agent's host;
* rank: ``OMPI_COMM_WORLD_RANK`` (mpi), ``RANK`` (torchrun), or the TF_CONFIG task;
* role: what the agent named the process (``SHIPYARD_PROCESS_NAME``: script, tf-ps,
  mpirun, ...), ``agent`` for the agent itself, ``mpi rank`` for an MPI rank.

Processes that are not Python (mpirun's launcher, prted) are listed without a stack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil

from shipyard import settings
from shipyard.errors import SettingError, ShipyardError
from shipyard.runtime import safepath


class StacksUnavailableError(ShipyardError):
    """py-spy is missing or may not read the processes."""


@dataclass
class ProcessStack:
    host: str
    pid: int
    role: str
    rank: str | None
    cmdline: str
    stack: str | None  # None: not a Python process
    error: str | None = None

    @property
    def label(self) -> str:
        rank = f" rank {self.rank}" if self.rank is not None else ""
        return f"{self.host}{rank} {self.role} (pid {self.pid})"


def py_spy() -> str:
    for cand in (os.path.join(os.path.dirname(sys.executable), "py-spy"), shutil.which("py-spy")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise StacksUnavailableError(
        "py-spy is not installed: pip install py-spy (a dependency of shipyard)"
    )


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


def _rank(env: dict[str, str]) -> str | None:
    for key in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):
        if env.get(key, "") != "":
            return env[key]
    if env.get("TF_CONFIG"):
        try:
            task = json.loads(env["TF_CONFIG"]).get("task") or {}
            return f"{task['type']}:{task['index']}"
        except (ValueError, KeyError, TypeError):
            return None
    return None


def _module(cmd: list[str]) -> str | None:
    """``python -m X ...`` -> X."""
    for i, part in enumerate(cmd[1:4], start=1):
        if part == "-m" and i + 1 < len(cmd):
            return cmd[i + 1]
    return None


def _role(proc: psutil.Process, env: dict[str, str], agent_pid: int, python: bool) -> str:
    if proc.pid == agent_pid:
        return "agent"
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        cmd = []
    if not python:  # mpirun's launcher, prted, a shell: what it is
        return os.path.basename(cmd[0] if cmd else proc.name())
    module = _module(cmd)
    if module == "shipyard.mpi.rank":
        return "mpi rank wrapper"
    if env.get("OMPI_COMM_WORLD_RANK", "") != "":
        return "mpi rank"
    name = env.get("SHIPYARD_PROCESS_NAME")
    if name:
        return {"user": "script"}.get(name, name)
    return module or os.path.basename(cmd[0] if cmd else proc.name())


def _host(proc: psutil.Process, env: dict[str, str], agent_host: str, role: str) -> str:
    """The instance a process works for: its SM_CURRENT_HOST; a rank wrapper (started
    with the master's environment) works for the instance of the rank it runs."""
    if role == "mpi rank wrapper":
        try:
            for child in proc.children():
                host = _environ(child).get("SM_CURRENT_HOST")
                if host:
                    return host
        except psutil.Error:
            pass
    return env.get("SM_CURRENT_HOST") or agent_host


def is_python(proc: psutil.Process) -> bool:
    try:
        exe = os.path.basename(proc.exe())
    except (psutil.Error, OSError):
        return False
    return exe.startswith("python")


def dump(pid: int, timeout: float = 30.0) -> tuple[str | None, str | None]:
    """(stack text, error) of one Python process. py-spy sometimes fails to read a
    process caught mid-update (more often on a loaded machine, and with native frames),
    so it is asked a few times, with native frames first, then without."""
    tool = py_spy()
    error = "py-spy failed"
    for attempt, args in enumerate((["--native"], [], ["--native"], [], [])):
        if attempt:
            time.sleep(0.05 * attempt)
        try:
            res = subprocess.run(
                [tool, "dump", "--pid", str(pid), *args],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return None, f"py-spy did not answer within {timeout:.0f} s"
        if res.returncode == 0:
            return res.stdout, None
        error = (res.stderr.strip().splitlines() or [f"py-spy exit status {res.returncode}"])[0]
        if not psutil.pid_exists(pid):
            return None, "the process ended"
    return None, error


def instance_processes(agents: dict[str, int]) -> list[tuple[str, int, psutil.Process]]:
    """(agent host, agent pid, process) for every agent and each of its descendants."""
    out = []
    for host, pid in sorted(agents.items()):
        try:
            agent = psutil.Process(pid)
            procs = [agent, *agent.children(recursive=True)]
        except psutil.Error:
            continue
        out += [(host, pid, p) for p in procs]
    return out


def collect(agents: dict[str, int]) -> list[ProcessStack]:
    """Stacks of every process of the instances whose agents are ``agents`` (host -> pid)."""
    found = instance_processes(agents)

    def one(item: tuple[str, int, psutil.Process]) -> ProcessStack | None:
        host, agent_pid, proc = item
        env = _environ(proc)
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            return None  # gone meanwhile
        python = is_python(proc)
        role = _role(proc, env, agent_pid, python)
        stack, error = dump(proc.pid) if python else (None, None)
        return ProcessStack(
            host=_host(proc, env, host, role),
            pid=proc.pid,
            role=role,
            rank=_rank(env),
            cmdline=cmdline,
            stack=stack,
            error=error,
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        stacks = [s for s in pool.map(one, found) if s is not None]
    return sorted(stacks, key=lambda s: (s.host, s.role != "agent", s.rank or "", s.pid))


def format_stacks(stacks: list[ProcessStack]) -> list[str]:
    """Plain lines: a header per process, then its stack (py-spy's own text)."""
    lines: list[str] = []
    for s in stacks:
        lines.append(f"=== {s.label}: {s.cmdline[:200]}")
        if s.stack is not None:
            body = s.stack.splitlines()
            # py-spy repeats the command line and version first; the threads follow
            start = next((i for i, ln in enumerate(body) if ln.startswith("Thread ")), 0)
            lines += [ln for ln in body[start:] if ln.strip()]
        elif s.error:
            lines.append(f"    (no stack: {s.error})")
        else:
            lines.append("    (not a Python process)")
    return lines


class SilenceWatch:
    """Dumps every process's stack into the job's logs when the job has printed nothing
    and reported no metric for ``seconds`` (``SHIPYARD_STACKS_ON_SILENCE`` in the job's
    ``environment``); once per silence: the dump itself is output, so the next one
    comes only after another ``seconds`` of silence."""

    def __init__(self, seconds: float, clock=None) -> None:
        self.seconds = seconds
        self.clock = clock or time.monotonic
        self.last = self.clock()
        self.dumps = 0
        self._busy = threading.Event()

    @classmethod
    def from_environment(cls, environment: dict[str, str]) -> SilenceWatch | None:
        try:
            seconds = settings.optional_number("SHIPYARD_STACKS_ON_SILENCE", environment or {})
        except SettingError:  # a watch, not the job: a bad value leaves it off
            return None
        return cls(seconds) if seconds else None

    def activity(self) -> None:
        self.last = self.clock()

    def check(self, agents: dict[str, int], log_files: dict[str, str]) -> bool:
        """Start a dump (in a thread) if the job has been silent long enough."""
        if self._busy.is_set() or self.clock() - self.last < self.seconds:
            return False
        self._busy.set()
        self.last = self.clock()
        silent_for = self.seconds
        threading.Thread(
            target=self._dump, args=(dict(agents), dict(log_files), silent_for), daemon=True
        ).start()
        return True

    def _dump(self, agents: dict[str, int], log_files: dict[str, str], silent: float) -> None:
        try:
            stacks = collect(agents)
            by_host: dict[str, list[ProcessStack]] = {}
            for s in stacks:
                host = s.host if s.host in log_files else next(iter(log_files))
                by_host.setdefault(host, []).append(s)
            for host, group in by_host.items():
                text = [
                    f"[shipyard-stacks] no output and no metric for {silent:g} s "
                    "(SHIPYARD_STACKS_ON_SILENCE): the stack of every process follows"
                ]
                text += [f"[shipyard-stacks] {ln}" for ln in format_stacks(group)]
                with safepath.open_record(log_files[host], "a", encoding="utf-8") as fh:
                    fh.write("\n".join(text) + "\n")
            self.dumps += 1
        except Exception as exc:  # noqa: BLE001 - a failed dump must not fail the job
            for path in list(log_files.values())[:1]:
                with safepath.open_record(path, "a", encoding="utf-8") as fh:
                    fh.write(f"[shipyard-stacks] stack dump failed: {exc}\n")
        finally:
            self.last = self.clock()
            self._busy.clear()
