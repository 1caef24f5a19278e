"""The two main processes of an ``mpi`` job's instances.

``python -m shipyard.mpi.launch --failure-file F -- mpirun ...`` (master):
runs mpirun and, when mpirun fails before any rank could say why (an option it rejects,
a program it cannot start), turns mpirun's own message (the text of its ``----`` banner)
into the failure text, so the job's FailureReason is that message and not a line of dashes.
A failing rank's text, written by its wrapper (mpi_rank), is left as it is.

``python -m shipyard.mpi.launch --wait`` (every other instance): the
counterpart of SageMaker's workers that wait for orted to come and go. On the local backend
the master's mpirun starts every rank on this machine, so the instance only waits; the
control plane stops it when the master (the only deciding host) has finished.
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from shipyard.mpi.rank import RANK_LINE
from shipyard.runtime.lifeline import die_with_parent

_TAIL_LINES = 60
# what mpirun prints when a rank ended the job (MPI_Abort, a fatal error handler): it
# should then end every rank and exit itself; CI once saw it print this and hang
ABORT_MARKS = ("MPI_ABORT was invoked", "MPI_ERRORS_ARE_FATAL")
ABORT_GRACE_S = 30.0
# after mpirun's exit, how long its children's last lines are still read
DRAIN_S = 2.0


def banner_text(lines: list[str]) -> str:
    """mpirun's last message: the lines between its last pair of ``-----`` rulers, joined;
    without rulers, the last few non-empty lines."""
    rulers = [i for i, ln in enumerate(lines) if ln.strip().startswith("-----")]
    if len(rulers) >= 2:
        body = lines[rulers[-2] + 1 : rulers[-1]]
    else:
        body = [ln for ln in lines if ln.strip()][-5:]
    return " ".join(" ".join(ln.split()) for ln in body if ln.strip())


def launch(command: list[str], failure_file: str) -> int:
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
    )  # noqa: PLW1509 - no threads yet

    def forward(signum: int, _frame=None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    assert proc.stderr is not None
    for line in _lines(proc):
        sys.stderr.write(line)
        sys.stderr.flush()
        if not RANK_LINE.match(line):  # a rank's own (tagged) output is not mpirun's
            tail.append(line.rstrip("\n"))
    code = proc.wait()
    if code != 0:
        message = banner_text(list(tail)) or f"mpirun exited with status {code}"
        try:
            with open(failure_file, "x", encoding="utf-8") as fh:
                fh.write(f"mpirun failed (exit status {code}): {message}"[:1024])
        except FileExistsError:
            pass  # a rank already wrote the root cause
    return code if code > 0 else (128 - code if code < 0 else 0)


def _lines(proc: subprocess.Popen) -> Iterator[str]:
    """mpirun's stderr, line by line, until mpirun has ended: where it says a rank
    aborted the job and is still running ``ABORT_GRACE_S`` later, it is stopped (SIGTERM,
    then SIGKILL); once it has exited, what its children still write is read for
    ``DRAIN_S`` more, not until they close the pipe (a daemon or an rsh client that
    outlives it would hold the launch, and the job, open)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    pending = b""
    abort_deadline: float | None = None
    exited_at: float | None = None
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        chunk = os.read(fd, 65536) if ready else b""
        if ready and not chunk:
            break  # every writer closed the pipe
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            line = raw.decode("utf-8", "replace") + "\n"
            if (
                abort_deadline is None
                and not RANK_LINE.match(line)  # mpirun's words, not a script's output
                and any(mark in line for mark in ABORT_MARKS)
            ):
                abort_deadline = time.monotonic() + ABORT_GRACE_S
            yield line
        now = time.monotonic()
        if proc.poll() is not None:
            exited_at = exited_at or now
            if now - exited_at >= DRAIN_S:
                break
        elif abort_deadline is not None and now >= abort_deadline:
            sys.stderr.write(
                f"[shipyard] mpirun did not exit {ABORT_GRACE_S:.0f} s after a rank aborted "
                "the job: stopping it\n"
            )
            _stop(proc)
    if pending:
        yield pending.decode("utf-8", "replace") + "\n"


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait() -> int:
    """Block until stopped (SIGTERM from the agent when the job ends)."""
    while True:
        signal.pause()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(prog="python -m shipyard.mpi.launch")
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--failure-file")
    args = parser.parse_args(argv)
    if args.wait:
        return wait()
    if not command or not args.failure_file:
        parser.error("give --failure-file F -- mpirun ..., or --wait")
    return launch(command, args.failure_file)


if __name__ == "__main__":
    sys.exit(main())
