"""The local backend: each instance is an agent process in its own session.

The agent is a session (and process group) leader, so stopping an instance signals the
whole group; descendants that left the group are found through the process tree. The
agent also gets PR_SET_PDEATHSIG: if the supervising process dies, so do instances.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from shipyard.backends.api import InstanceHandle, LaunchSpec
from shipyard.errors import BackendError
from shipyard.runtime.lifeline import die_with_parent


def _agent_preexec() -> None:
    die_with_parent(signal.SIGTERM)


class LocalBackend:
    name = "local"

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}

    def launch(self, specs: list[LaunchSpec]) -> list[InstanceHandle]:
        handles: list[InstanceHandle] = []
        try:
            for spec in specs:
                os.makedirs(os.path.dirname(spec.log_path), exist_ok=True)
                with open(spec.log_path, "ab", buffering=0) as log:
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "shipyard.agent",
                            "--config",
                            spec.config_path,
                            "--host",
                            spec.host,
                            "--log",
                            spec.log_path,
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=spec.env,
                        start_new_session=True,
                        preexec_fn=_agent_preexec,
                        close_fds=True,
                    )
                self._procs[proc.pid] = proc
                handles.append(InstanceHandle(spec.host, proc.pid, spec.log_path))
        except OSError as exc:
            self.stop(handles, grace=1.0)
            raise BackendError(f"could not start instance {spec.host}: {exc}") from exc
        return handles

    def poll(self, handle: InstanceHandle) -> int | None:
        proc = self._procs.get(handle.pid)
        if proc is None:
            return None if psutil.pid_exists(handle.pid) else -1
        return proc.poll()

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
        psutil.wait_procs(victims, timeout=5)


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
