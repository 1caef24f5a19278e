"""Start shard processes on this machine: for runners, benchmarks and tests.

Why here: whoever starts shards (the native_parameter_server runner, the
throughput benchmark, the integration tests) needs the same three things: the
exact command line, a way to know the shard is serving (and on which port, when
it picked one), and a stop that ends in a final checkpoint, never a hang.
``shard_command`` is the pure part; ``start_shards`` runs them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import PSError


def shard_command(
    index: int,
    num_shards: int,
    bind: str,
    *,
    checkpoint_dir: str | None = None,
    consistency: str = "async",
    max_staleness: int | None = None,
    num_workers: int | None = None,
    heartbeat_timeout: float | None = None,
    checkpoint_interval: float | None = None,
    ready_file: str | None = None,
    max_message_bytes: int | None = None,
    exit_with_parent: bool = False,
    stats_file: str | None = None,
    exit_when_done: bool = False,
    join_timeout: float | None = None,
    failure_file: str | None = None,
    frame_timeout: float | None = None,
    python: str = sys.executable,
) -> list[str]:
    """argv for ``python -m shipyard.ps.server`` (the secret travels in the environment)."""
    cmd = [
        python,
        "-m",
        "shipyard.ps.server",
        "--bind",
        bind,
        "--shard-index",
        str(index),
        "--num-shards",
        str(num_shards),
        "--consistency",
        consistency,
    ]
    if checkpoint_dir:
        cmd += ["--checkpoint-dir", str(checkpoint_dir)]
    if max_staleness is not None:
        cmd += ["--max-staleness", str(max_staleness)]
    if num_workers is not None:
        cmd += ["--num-workers", str(num_workers)]
    if heartbeat_timeout is not None:
        cmd += ["--heartbeat-timeout", str(heartbeat_timeout)]
    if checkpoint_interval is not None:
        cmd += ["--checkpoint-interval", str(checkpoint_interval)]
    if max_message_bytes is not None:
        cmd += ["--max-message-bytes", str(max_message_bytes)]
    if ready_file:
        cmd += ["--ready-file", str(ready_file)]
    if exit_with_parent:
        cmd += ["--exit-with-parent"]
    if exit_when_done:
        cmd += ["--exit-when-done"]
    if join_timeout is not None:
        cmd += ["--join-timeout", str(join_timeout)]
    if failure_file:
        cmd += ["--failure-file", str(failure_file)]
    if frame_timeout is not None:
        cmd += ["--frame-timeout", str(frame_timeout)]
    if stats_file:  # "{index}" in the path becomes the shard index
        cmd += ["--stats-file", str(stats_file).format(index=index)]
    return cmd


@dataclass
class ShardProcess:
    """A running shard started by ``start_shards``."""

    index: int
    proc: subprocess.Popen
    ready_file: Path
    log_path: Path
    endpoint: str = ""
    info: dict = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM (final checkpoint, clean exit); SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise PSError(
                    f"shard {self.index} ignored SIGTERM for {timeout}s and was killed"
                ) from None
        return int(self.proc.returncode)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def start_shards(
    num_shards: int,
    secret: str,
    *,
    host: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
    run_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 30.0,
    **options: Any,
) -> list[ShardProcess]:
    """Start ``num_shards`` shard processes and wait until each serves.

    ``ports`` default to 0 (each shard picks a free port and reports it).
    ``options`` are ``shard_command`` keyword arguments (checkpoint_dir,
    consistency, max_staleness, num_workers, heartbeat_timeout, ...).
    """
    from .wire import (
        SECRET_ENV,  # numpy: not needed by the runners' planning (shard_command)
    )

    rd = Path(run_dir or tempfile.mkdtemp(prefix="shipyard-ps-"))
    rd.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    child_env[SECRET_ENV] = secret
    src = str(Path(__file__).resolve().parents[2])  # make `-m shipyard.ps.server` importable
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (src, child_env.get("PYTHONPATH", "")) if p
    )
    shards: list[ShardProcess] = []
    try:
        for i in range(num_shards):
            port = ports[i] if ports else 0
            ready = rd / f"shard-{i}.ready.json"
            if ready.exists():
                ready.unlink()
            log_path = rd / f"shard-{i}.log"
            options.setdefault("exit_with_parent", True)  # never outlive the launcher
            cmd = shard_command(
                i, num_shards, f"tcp://{host}:{port}", ready_file=str(ready), **options
            )
            with open(log_path, "ab") as logf:
                proc = subprocess.Popen(
                    cmd,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                )
            shards.append(ShardProcess(i, proc, ready, log_path))
        deadline = time.monotonic() + startup_timeout
        for s in shards:
            while not s.ready_file.exists():
                if s.proc.poll() is not None:
                    raise PSError(
                        f"shard {s.index} exited with {s.proc.returncode} before serving:\n{s.log()[-2000:]}"
                    )
                if time.monotonic() > deadline:
                    raise PSError(
                        f"shard {s.index} not serving after {startup_timeout}s:\n{s.log()[-2000:]}"
                    )
                time.sleep(0.02)
            s.info = json.loads(s.ready_file.read_text())
            s.endpoint = s.info["endpoint"]
        return shards
    except BaseException:
        for s in shards:
            s.kill()
        raise


def stop_shards(shards: Sequence[ShardProcess], timeout: float = 20.0) -> list[int]:
    """SIGTERM every shard (final checkpoints happen in parallel), then wait for each."""
    for s in shards:
        if s.alive:
            s.proc.send_signal(signal.SIGTERM)
    codes = []
    for s in shards:
        try:
            codes.append(s.proc.wait(timeout))
        except subprocess.TimeoutExpired:
            s.kill()
            codes.append(-9)
    return codes
