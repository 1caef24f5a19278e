"""TensorBoard for a job, started by the dashboard: ``shipyard tensorboard``'s own code
path (``observe.tensorboard``: where the job's event files are, the command line), one
TensorBoard per job on a free port of the dashboard's own address, reused while it runs
and ended with the dashboard (its lifespan's shutdown), so none is left behind.

Why a child of the dashboard and not a link to a TensorBoard the user starts: a page
cannot start a process, and a user reading a job's page wants its curves now (the
anchors' dashboards have the link on the run's page).
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from shipyard.control.client import ControlPlane
from shipyard.errors import ShipyardError
from shipyard.observe import tensorboard as tb

READY_S = 60.0  # hang guard: TensorBoard imports TensorFlow's stubs, seconds on a busy host


class TensorBoardUnavailableError(ShipyardError):
    """TensorBoard cannot be started for this job (not installed, no event files, or it
    exited); the message says which and what to do."""


@dataclass
class Board:
    job: str
    port: int
    logdir: str
    proc: subprocess.Popen


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _answers(host: str, port: int) -> bool:
    target = "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)
    try:
        with socket.create_connection((target, port), timeout=1):
            return True
    except OSError:
        return False


class Boards:
    """The dashboard's TensorBoards, one per job (thread-safe: requests run in threads)."""

    def __init__(self, control: ControlPlane, host: str) -> None:
        self.control = control
        self.host = host
        self.running: dict[str, Board] = {}
        self.lock = threading.Lock()

    def open(self, job: str) -> Board:
        """The job's TensorBoard, started (and waited for until it answers) if need be."""
        with self.lock:
            board = self.running.get(job)
            if board is not None and board.proc.poll() is None:
                return board
            if importlib.util.find_spec("tensorboard") is None:
                raise TensorBoardUnavailableError(
                    "TensorBoard is not installed where the dashboard runs: "
                    "pip install tensorboard, then restart shipyard ui"
                )
            record = self.control.get(job)
            try:
                logs = tb.job_logdir(job, record.job_dir, record.spec)
            except tb.NoTensorBoardOutputError as exc:
                raise TensorBoardUnavailableError(str(exc)) from None
            port = _free_port(self.host)
            proc = tb.start([logs], self.host, port)
            board = Board(job, port, logs.logdir, proc)
            self.running[job] = board
        deadline = time.monotonic() + READY_S
        while not _answers(self.host, port):
            code = proc.poll()
            if code is not None or time.monotonic() > deadline:
                self._end(board)
                why = f"exited with code {code}" if code is not None else "did not answer"
                raise TensorBoardUnavailableError(
                    f"TensorBoard for {job!r} {why}: run shipyard tensorboard {job} to see its output"
                )
            time.sleep(0.2)
        return board

    def _end(self, board: Board) -> None:
        with self.lock:
            if self.running.get(board.job) is board:
                del self.running[board.job]
        if board.proc.poll() is None:
            board.proc.terminate()
            try:
                board.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                board.proc.kill()
                board.proc.wait()

    def close(self) -> None:
        """End every TensorBoard this dashboard started (its shutdown)."""
        for board in list(self.running.values()):
            self._end(board)
