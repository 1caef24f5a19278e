"""The local backend: each instance is an agent process in its own session.

The agent is a session (and process group) leader, so stopping an instance signals the
whole group; descendants that left the group are found through the process tree. The
agent arms its own death signal (PR_SET_PDEATHSIG) on start, so if the supervising
process dies, so do instances; no preexec_fn runs between fork and exec.

When the job's AgentConfig enables the sandbox, a network holder
(shipyard.sandbox.network) is started first and every agent enters its own namespaces
joined to that holder's bridge (shipyard.sandbox.instance).

Each instance also gets its type's share of the machine (``backends.resources``): a
cgroup with its CPUs, memory and process limits, joined by the agent's pid right after
spawning it (the interpreter is still starting: nothing the instance runs is born
outside), and its GPUs in ``CUDA_VISIBLE_DEVICES``. The cgroups end with the launch.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import psutil

from shipyard.backends import resources
from shipyard.backends.api import InstanceHandle, LaunchSpec
from shipyard.errors import BackendError
from shipyard.jobplan.config import AgentConfig
from shipyard.runtime.reaping import wait_gone

HOLDER_START_TIMEOUT_S = 10.0


class LocalBackend:
    name = "local"

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}
        # each job network holder, with the agent pids it serves
        self._holders: list[tuple[subprocess.Popen, list[int]]] = []
        # each agent pid's launch share of the machine (cgroups, GPUs), and its host
        self._allotments: dict[int, tuple[resources.Allotment, str]] = {}
        # set by the supervisor: True once the job should stop (ends a wait for GPUs)
        self.should_stop: Callable[[], bool] = lambda: False

    def launch(self, specs: list[LaunchSpec]) -> list[InstanceHandle]:
        handles: list[InstanceHandle] = []
        holder = None
        allotment = None
        spec = specs[0] if specs else None
        try:
            config = _config(specs)
            sandbox = config.sandbox if config is not None and config.sandboxed else None
            # the holder first: its bridge comes up while the cgroups are made; agents
            # start without waiting for it, each waits for the part it needs
            if sandbox is not None:
                holder = self._start_holder(sandbox.rootless)
            if config is not None:
                allotment = resources.allot(
                    config.resources(),
                    [s.host for s in specs],
                    specs[0].job_name,
                    os.path.dirname(specs[0].config_path),
                    specs[0].log_path,
                    self.should_stop,
                )
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
                env = allotment.env(spec.host, spec.env) if allotment else spec.env
                with open(spec.log_path, "ab", buffering=0) as log:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                        close_fds=True,
                    )
                self._procs[proc.pid] = proc
                if allotment is not None:
                    self._allotments[proc.pid] = (allotment, spec.host)
                    allotment.join(spec.host, proc.pid)
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
            if allotment is not None:
                allotment.release()
            if isinstance(exc, BackendError):
                raise
            host = spec.host if spec is not None else "?"
            raise BackendError(f"could not start instance {host}: {exc}") from exc
        return handles

    def _start_holder(self, rootless: bool) -> subprocess.Popen:
        """The job network's holder (``_wait_ready``: until its bridge exists), in an
        environment of its own: nothing of the job's (``PYTHON*``) reaches it."""
        from shipyard.sandbox import network

        return subprocess.Popen(
            network.holder_argv(os.getpid(), rootless),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={"PATH": os.defpath},
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
        code = proc.poll()
        if code is not None:
            self._ended(handle.pid)
        return code

    def _ended(self, pid: int) -> None:
        """An agent has exited: note what its cgroup says about why, and once every
        instance of its launch has, end the launch's cgroups and GPU leases."""
        entry = self._allotments.get(pid)
        if entry is None:
            return
        allotment, host = entry
        allotment.ended(host)
        mine = [p for p, (a, _) in self._allotments.items() if a is allotment]
        if all(self._procs[p].poll() is not None for p in mine):
            allotment.release()

    def resource_failure(self, handle: InstanceHandle) -> str | None:
        """Why the kernel ended this instance (its memory or process limit), if it did."""
        entry = self._allotments.get(handle.pid)
        return entry[0].verdict(entry[1]) if entry else None

    def instance_cgroup(self, handle: InstanceHandle):
        """The instance's live cgroup (utilization), or None."""
        entry = self._allotments.get(handle.pid)
        return entry[0].instance_cgroup(entry[1]) if entry else None

    def _reap_holders(self) -> None:
        self._holders = [(h, pids) for h, pids in self._holders if h.poll() is None]

    def stop(self, handles: list[InstanceHandle], grace: float) -> None:
        """SIGTERM once to each user process, SIGKILL what is left after ``grace``.

        A live agent is sent the SIGTERM alone: it forwards it to its processes
        (``terminate_descendants``) and gives them the grace. Signalling its process group
        and every process of its tree as well made a user's handler run two or three
        times (a script printing on SIGTERM wrote its line twice, interleaved); SageMaker
        sends one. Where there is no agent (it has exited, or exits before forwarding),
        its processes get the SIGTERM from here, once."""
        victims: list[psutil.Process] = []
        trees: dict[int, list[psutil.Process]] = {}
        for handle in handles:
            tree = trees[handle.pid] = _tree(handle.pid)
            victims.extend(tree)
            if tree and self.poll(handle) is None:
                _signal(tree[0], signal.SIGTERM)
            else:
                trees.pop(handle.pid)
                try:
                    os.killpg(handle.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
                for victim in tree:
                    _signal(victim, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            for handle in handles:  # an agent gone: what it left gets the SIGTERM from here
                if handle.pid in trees and self.poll(handle) is not None:
                    for victim in _alive(trees.pop(handle.pid)[1:]):
                        _signal(victim, signal.SIGTERM)
            if all(self.poll(h) is not None for h in handles) and not _alive(victims):
                break
            time.sleep(0.05)
        for handle in handles:
            try:
                os.killpg(handle.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for victim in _alive(victims):
            _signal(victim, signal.SIGKILL)
        for handle in handles:
            proc = self._procs.get(handle.pid)
            if proc is not None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        wait_gone(victims, timeout=5)  # a zombie init has yet to reap has ended
        for handle in handles:
            if handle.pid in self._procs and self._procs[handle.pid].poll() is not None:
                self._ended(handle.pid)
        # a holder whose instances have all ended sees them gone and exits
        for holder, pids in list(self._holders):
            if all(p in self._procs and self._procs[p].poll() is not None for p in pids):
                try:
                    holder.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    _end(holder)
        self._reap_holders()


def _config(specs: list[LaunchSpec]) -> AgentConfig | None:
    """The job's agent config (None: the agent itself reports an unreadable one)."""
    if not specs:
        return None
    try:
        return AgentConfig.load(specs[0].config_path)
    except (OSError, ValueError):  # AgentConfigError is a ValueError
        return None


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


def _signal(proc: psutil.Process, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except psutil.Error:
        pass


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            pass
    return alive
