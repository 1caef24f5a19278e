"""``python -m shipyard.ps.worker -- CMD ...``: one training process of a shipyard.ps job.

Why a wrapper: the shards of a job must stop by themselves once training is over,
and must know how each worker ended, even one that crashed before it ever connected
or was killed mid-step. The wrapper runs the user's command, passes its output
through (keeping the tail of stderr, the traceback), and when it exits tells every
shard (a DONE message with the exit status and that tail). Each shard answers once
every worker of the job has ended, with its final counters; the wrapper merges
them into the job's report (``stats.final_report``) and writes it where the agent
collects it (``$SHIPYARD_REPORT_PATH``), then exits with the command's status
(128 + N for a command killed by signal N).

Environment: the worker's own ``SHIPYARD_PS_SECRET``, ``SHIPYARD_PS_ENDPOINTS``,
``SHIPYARD_PS_RANK`` (see shipyard.ps.client).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence

from shipyard import settings
from shipyard.runtime.lifeline import die_with_parent

from .client import PSClient
from .errors import PSConfigError, PSError, PSTimeoutError, RemoteError
from .stats import final_report

log = logging.getLogger("shipyard.ps.worker")

TAIL_BYTES = 2000
WAIT_FOR_JOB_S = 30 * 86400.0  # the other workers may train for days
WAIT_WHEN_STOPPED_S = 2.0
CHECK_EVERY_S = 30.0
RETRY_DONE_S = 15.0


class _Tee(threading.Thread):
    """Copies the child's stderr to ours as it comes, keeping the last bytes."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="ps-worker-stderr", daemon=True)
        self.fd = fd
        self.tail: deque[bytes] = deque()
        self.size = 0

    def run(self) -> None:
        out = sys.stderr.buffer
        while True:
            data = os.read(self.fd, 65536)
            if not data:
                return
            out.write(data)
            out.flush()
            self.tail.append(data)
            self.size += len(data)
            while self.size - len(self.tail[0]) >= TAIL_BYTES:
                self.size -= len(self.tail.popleft())

    def text(self) -> str:
        return b"".join(self.tail)[-TAIL_BYTES:].decode("utf-8", errors="replace")


def run_command(cmd: Sequence[str]) -> tuple[int, str, bool]:
    """Run ``cmd``; returns (exit status as a shell reports it, stderr tail, stopped by us)."""
    child = subprocess.Popen(list(cmd), stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    stopped = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        stopped.set()
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    assert child.stderr is not None
    tee = _Tee(child.stderr.fileno())
    tee.start()
    code = child.wait()
    tee.join(timeout=5)
    status = 128 - code if code < 0 else code
    return status, tee.text() if status else "", stopped.is_set()


def write_json(path: str, obj: object) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def report_done(
    status: int, error: str, report_path: str | None, timeout: float, resend_for: float
) -> None:
    """DONE to every shard; wait for the job's end; write the merged report.

    ``resend_for``: for how many seconds of transport errors in a row DONE is sent again.
    A worker whose command ended passes RETRY_DONE_S: the shards refusing that long are
    gone (the job ended without this rank), and before this bound such a worker resent for
    its whole 30-day wait until the job's end killed it. A stopped worker passes its own
    short wait: its job is being torn down and its agent SIGKILLs it after the stop
    grace."""
    client = PSClient(heartbeat_interval=0, connect=False, timeout=timeout)
    try:
        deadline = time.monotonic() + timeout
        # a loaded machine may refuse or reset a connection for a moment: DONE is
        # idempotent at the shard, so it is sent again, for ``resend_for`` seconds of
        # errors in a row (shards that refuse for longer are gone), never past the deadline
        failing_since: float | None = None
        while True:
            try:
                answers = client.finish(status, error, timeout=min(CHECK_EVERY_S, timeout))
                break
            except PSTimeoutError:
                failing_since = None  # connected: the shards are alive, only still busy
                if time.monotonic() >= deadline:
                    raise
                # still training elsewhere, or the shards are gone (the job ended without
                # waiting for this rank)? A shard answers STATS at once when it is alive.
                client.shard_stats(timeout=CHECK_EVERY_S)
            except (RemoteError, PSConfigError):
                raise
            except PSError as exc:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= resend_for or now >= deadline:
                    raise
                log.info("DONE not delivered (%s); sending it again", exc)
                time.sleep(0.5)
    finally:
        client.close(leave=False)
    report = final_report(answers, client.endpoints)
    for warning in report["warnings"]:
        print(f"shipyard.ps: WARNING: {warning}", file=sys.stderr, flush=True)
    lost = {r: o for r, o in report["workers_final"].items() if o.get("exit_code") != 0}
    print(
        f"shipyard.ps: rank {client.worker_id}: every worker has ended"
        + (f"; not successful: {json.dumps(lost, sort_keys=True)}" if lost else ""),
        flush=True,
    )
    if report_path:
        write_json(report_path, report)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m shipyard.ps.worker", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--report",
        default=settings.get("SHIPYARD_REPORT_PATH"),
        help="write the job's merged report here (default $SHIPYARD_REPORT_PATH)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command given: python -m shipyard.ps.worker -- python train.py ...")
    status, error, stopped = run_command(cmd)
    if not stopped:
        _report(status, error, args.report, WAIT_FOR_JOB_S, RETRY_DONE_S)
        return status
    # Stopped: the job is being torn down and this wrapper's agent SIGKILLs it after the
    # stop grace. A shard whose instance is already gone does not refuse a connection, it
    # never answers (a connect blocks for the transport's whole connect timeout), so the
    # report gets WAIT_WHEN_STOPPED_S in all, in a thread this exit does not wait for.
    reporter = threading.Thread(
        target=_report,
        args=(status, error, args.report, WAIT_WHEN_STOPPED_S, WAIT_WHEN_STOPPED_S),
        name="ps-worker-done",
        daemon=True,
    )
    reporter.start()
    reporter.join(WAIT_WHEN_STOPPED_S)
    if reporter.is_alive():
        print(
            "shipyard.ps: could not report the end of this worker to the shards: no answer "
            f"within {WAIT_WHEN_STOPPED_S:.0f}s of the stop",
            file=sys.stderr,
            flush=True,
        )
    return status


def _report(
    status: int, error: str, report_path: str | None, timeout: float, resend_for: float
) -> None:
    try:
        report_done(status, error, report_path, timeout, resend_for)
    except (PSError, OSError) as exc:
        print(
            f"shipyard.ps: could not report the end of this worker to the shards: {exc}",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
