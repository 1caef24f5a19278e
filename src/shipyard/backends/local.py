"""The local backend: each instance is an agent process in its own session.

The agent is a session (and process group) leader, so stopping an instance signals the
whole group; descendants that left the group are found through the process tree. The
agent arms its own death signal (PR_SET_PDEATHSIG) on start, so if the supervising
process dies, so do instances; no preexec_fn runs between fork and exec.

When the job's AgentConfig enables the sandbox, a network holder
(shipyard.sandbox.network) is started first and every agent enters its own namespaces
joined to that holder's bridge (shipyard.sandbox.instance).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import psutil

from shipyard.agent.config import AgentConfig
from shipyard.agent.processes import wait_gone
from shipyard.backends.api import InstanceHandle, LaunchSpec
from shipyard.errors import BackendError

HOLDER_START_TIMEOUT_S = 10.0


class LocalBackend:
    name = "local"

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}
        # each job network holder, with the agent pids it serves
        self._holders: list[tuple[subprocess.Popen, list[int]]] = []

    def launch(self, specs: list[LaunchSpec]) -> list[InstanceHandle]:
        handles: list[InstanceHandle] = []
        holder = None
        spec = specs[0] if specs else None
        try:
            sandbox = _sandbox(specs)
            if sandbox is not None:  # agents start meanwhile; each waits for what it needs
                holder = self._start_holder(bool(sandbox.get("rootless")), specs[0].env)
            for spec in specs:
                os.makedirs(os.path.dirname(spec.log_path), exist_ok=True)
                argv = [
                    sys.executable,
                    "-m",
                    "shipyard.agent",
                    "--config",
                    spec.config_path,
                    "--host",
                    spec.host,
                    "--log",
                    spec.log_path,
                    "--parent-pid",
                    str(os.getpid()),
                ]
                if holder is not None:
                    argv += ["--sandbox-holder", str(holder.pid)]
                with open(spec.log_path, "ab", buffering=0) as log:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=spec.env,
                        start_new_session=True,
                        close_fds=True,
                    )
                self._procs[proc.pid] = proc
                handles.append(InstanceHandle(spec.host, proc.pid, spec.log_path))
            if holder is not None and holder.stdin is not None:
                self._wait_ready(holder)
                pids = [h.pid for h in handles]
                holder.stdin.write(("pids " + " ".join(map(str, pids)) + "\n").encode())
                holder.stdin.flush()
                self._holders.append((holder, pids))
        except (OSError, BackendError) as exc:
            self.stop(handles, grace=1.0)
            if holder is not None:
                _end(holder)
            if isinstance(exc, BackendError):
                raise
            host = spec.host if spec is not None else "?"
            raise BackendError(f"could not start instance {host}: {exc}") from exc
        return handles

    def _start_holder(self, rootless: bool, env: dict[str, str]) -> subprocess.Popen:
        """The job network's holder (``_wait_ready``: until its bridge exists)."""
        argv = [sys.executable, "-m", "shipyard.sandbox.network", "--parent", str(os.getpid())]
        if rootless:
            argv.append("--rootless")
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )

    @staticmethod
    def _wait_ready(holder: subprocess.Popen) -> None:
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], HOLDER_START_TIMEOUT_S)
        line = holder.stdout.readline().decode(errors="replace").strip() if ready else ""
        if line != "ready":
            _end(holder)
            raise BackendError(
                "could not create the job's private network for its instance sandboxes: "
                f"{line or f'no answer within {HOLDER_START_TIMEOUT_S:.0f}s'}; "
                "`shipyard doctor` says what this machine supports, "
                "SHIPYARD_SANDBOX=off runs instances without sandboxes"
            )
        holder.stdout.close()

    def poll(self, handle: InstanceHandle) -> int | None:
        self._reap_holders()
        proc = self._procs.get(handle.pid)
        if proc is None:
            return None if psutil.pid_exists(handle.pid) else -1
        return proc.poll()

    def _reap_holders(self) -> None:
        self._holders = [(h, pids) for h, pids in self._holders if h.poll() is None]

    def stop(self, handles: list[InstanceHandle], grace: float) -> None:
        victims: list[psutil.Process] = []
        for handle in handles:
            victims.extend(_tree(handle.pid))
            try:
                os.killpg(handle.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        for victim in victims:
            try:
                victim.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if all(self.poll(h) is not None for h in handles) and not _alive(victims):
                break
            time.sleep(0.05)
        for handle in handles:
            try:
                os.killpg(handle.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for victim in _alive(victims):
            try:
                victim.kill()
            except psutil.Error:
                pass
        for handle in handles:
            proc = self._procs.get(handle.pid)
            if proc is not None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        wait_gone(victims, timeout=5)  # a zombie init has yet to reap has ended
        # a holder whose instances have all ended sees them gone and exits
        for holder, pids in list(self._holders):
            if all(p in self._procs and self._procs[p].poll() is not None for p in pids):
                try:
                    holder.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    _end(holder)
        self._reap_holders()


def _sandbox(specs: list[LaunchSpec]) -> dict | None:
    """The job's sandbox settings when its instances run sandboxed, else None."""
    if not specs:
        return None
    try:
        config = AgentConfig.load(specs[0].config_path)
    except (OSError, ValueError, TypeError):
        return None  # the agent itself reports an unreadable config
    return config.sandbox if config.sandboxed else None


def _end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            pass
    return alive
