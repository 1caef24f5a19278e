"""The master process of a model server: one listening socket, N worker processes.

The master binds the port itself (so "port in use" is a clear, immediate failure),
sets TCP_NODELAY on it (accepted sockets inherit it; small responses must not wait
for Nagle's algorithm: 23 vs 1233 req/s on this kind of machine), and hands it to the
workers, which share it. How a worker is started is the caller's (``Launch``): a plain
child here; an endpoint's launcher (shipyard.control.endpoint_box) starts each one in the
endpoint's instance sandbox instead, which serving itself must not import (a floor
beside it). It records the server's status in a JSON state file
(Creating -> InService | Failed, with the reason) for the control plane, restarts a
worker that dies after it was ready, and on SIGTERM stops every worker before exiting.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from shipyard.serving.config import CONFIG_ENV, ServerConfig

log = logging.getLogger("shipyard.serving")
READY_TIMEOUT = float(os.environ.get("SAGEMAKER_STARTUP_TIMEOUT", "600"))
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # shipyard.serving.prometheus.ENV
# (argv, env, fds to pass) -> the started worker: how the master starts each worker
Launch = Callable[[list[str], dict[str, str], tuple[int, ...]], subprocess.Popen]


def plain_launch(
    argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...]
) -> subprocess.Popen:
    """A worker as a plain child of the master (``python -m shipyard.serving``)."""
    return subprocess.Popen(argv, env=env, pass_fds=pass_fds, stdin=subprocess.DEVNULL)


def write_state(path: str | None, **state: Any) -> None:
    if not path:
        return
    state.setdefault("pid", os.getpid())
    state["updated_at"] = time.time()
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket; OSError with a clear message when the port is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(
                exc.errno,
                f"port {port} on {host} is already in use; pick another "
                "port (--port) or delete the endpoint using it",
            ) from None
        raise
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class Master:
    def __init__(
        self,
        config: ServerConfig,
        sock: socket.socket,
        launch: Launch = plain_launch,
        base_env: Mapping[str, str] | None = None,
        metrics_dir: str | None = None,
        label: str | None = None,
        missing: list[str] | None = None,
    ) -> None:
        """``base_env``: what workers start from (default: this process's environment);
        ``label``: the path in each worker's argv (``ps`` and the control plane's
        leftover sweep find an endpoint's workers by it; default the model directory);
        ``missing``: the protections the workers run without, for the state file."""
        self.config = config
        self.sock = sock
        self.launch = launch
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.label = label or config.model_dir
        self.missing = list(missing or [])
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, True)
        self.workers: dict[int, subprocess.Popen] = {}
        self.ready: set[int] = set()
        self.failure: str | None = None
        self.stopping = False
        self.restarts: list[float] = []
        self.buffer = b""
        # the workers' shared /metrics samples
        if metrics_dir is None:
            from shipyard.serving import prometheus  # asyncio: not before a launcher needs it

            metrics_dir = prometheus.make_dir()
        self.metrics_dir = metrics_dir

    def spawn(self, load_first: bool = False) -> None:
        """Start one worker. ``load_first``: a replacement beside workers already serving
        loads its model before it takes connections from the shared socket, so no
        request reaches it while it loads (the first workers answer /ping 503 instead,
        which is what a caller waiting for the endpoint wants to see)."""
        env = dict(
            self.base_env,
            **{
                CONFIG_ENV: self.config.to_json(),
                "SHIPYARD_SERVING_FD": str(self.sock.fileno()),
                "SHIPYARD_SERVING_REPORT_FD": str(self.write_fd),
                METRICS_ENV: self.metrics_dir,
            },
        )
        if load_first:
            env["SHIPYARD_SERVING_LOAD_FIRST"] = "1"
        # the model directory in argv: `ps` shows what each worker serves
        proc = self.launch(
            [sys.executable, "-m", "shipyard.serving.worker", self.label],
            env,
            (self.sock.fileno(), self.write_fd),
        )
        self.workers[proc.pid] = proc

    def state(self, status: str, reason: str | None = None) -> None:
        write_state(
            self.config.state_file,
            status=status,
            failure_reason=reason,
            port=self.sock.getsockname()[1],
            workers=sorted(self.workers),
            missing_protections=self.missing,
        )

    def read_reports(self, timeout: float) -> None:
        ready, _, _ = select.select([self.read_fd], [], [], timeout)
        if not ready:
            return
        self.buffer += os.read(self.read_fd, 65536)
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            kind, _, rest = raw.decode().partition(" ")
            if kind == "ready":
                self.ready.add(self._host_pid(int(rest)))
            elif kind == "failed" and self.failure is None:
                self.failure = json.loads(rest)
                log.error("model failed to load: %s", self.failure)
                self.state("Failed", self.failure)

    def _host_pid(self, reported: int) -> int:
        """The worker that said ``ready <pid>``: a worker in a PID namespace of its own
        (an endpoint's sandbox) knows its pid there, the kernel's ``NSpid`` maps it."""
        if reported in self.workers:
            return reported
        for pid in self.workers:
            if _innermost_pid(pid) == reported:
                return pid
        return reported

    def reap(self) -> None:
        for pid, proc in list(self.workers.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.workers[pid]
            was_ready = pid in self.ready
            self.ready.discard(pid)
            if self.stopping or self.failure:
                continue
            now = time.monotonic()
            self.restarts = [t for t in self.restarts if now - t < 60] + [now]
            if not was_ready or len(self.restarts) > 5:
                self.failure = (
                    f"a worker exited with code {code} "
                    + ("while loading the model" if not was_ready else "five times within a minute")
                    + "; see the server log"
                )
                self.state("Failed", self.failure)
                continue
            log.warning("worker %d exited with code %s; starting another", pid, code)
            self.spawn(load_first=True)

    def stop(self, grace: float = 10.0) -> None:
        self.stopping = True
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.workers.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run(self) -> int:
        def on_signal(signum: int, frame: Any) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.state("Creating")
        for _ in range(max(1, self.config.workers)):
            self.spawn()
        started, in_service = time.monotonic(), False
        try:
            while not self.stopping:
                self.read_reports(0.2)
                self.reap()
                if (
                    not in_service
                    and not self.failure
                    and len(self.ready) >= max(1, self.config.workers)
                ):
                    in_service = True
                    self.state("InService")
                    log.info(
                        "serving on %s:%d with %d worker(s)",
                        self.config.host,
                        self.sock.getsockname()[1],
                        len(self.ready),
                    )
                if (
                    not in_service
                    and not self.failure
                    and time.monotonic() - started > READY_TIMEOUT
                ):
                    self.failure = f"the model did not load within {READY_TIMEOUT:.0f} s"
                    self.state("Failed", self.failure)
        finally:
            self.stop()
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            self.state("Deleted", self.failure)
        return 0


def _innermost_pid(pid: int) -> int | None:
    """``pid``'s number in its own PID namespace (the last of /proc's ``NSpid``)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def serve(config: ServerConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="shipyard-serve: %(message)s")
    try:
        sock = bind(config.host, config.port)
    except OSError as exc:
        write_state(config.state_file, status="Failed", failure_reason=exc.strerror or str(exc))
        log.error("%s", exc.strerror or exc)
        return 2
    config.port = sock.getsockname()[1]
    return Master(config, sock).run()
