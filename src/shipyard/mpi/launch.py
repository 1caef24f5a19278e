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
import signal
import subprocess
import sys

from shipyard.mpi.rank import RANK_LINE
from shipyard.runtime.lifeline import die_with_parent

_TAIL_LINES = 60


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
    for raw in iter(proc.stderr.readline, b""):
        line = raw.decode("utf-8", "replace")
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
