"""The rank wrapper: what mpirun starts for every rank of an ``mpi`` job.

``python -m shipyard.mpi.rank --plan <master>/agent/mpi-plan.json -- <command>``

mpirun runs on the master instance, so every rank starts with the master's environment
and working directory. A rank belongs to instance ``hosts[rank // processes_per_host]``
(ranks are placed host by host, as ``mpirun --host algo-1:N,algo-2:N`` does); this wrapper
gives it that instance's world before the user's command runs:

* the instance's process environment (``<instance>/agent/process-env.json``, written by
  that instance's agent when it planned; waited for, boundedly, since the agents start
  together), so SM_CURRENT_HOST, SM_MODEL_DIR, the channels and the hostname resolver
  are that instance's;
* on top, whatever mpirun changed or added relative to the master's planned environment
  (OMPI_*/PMIX_* rank variables, ``-x`` exports of custom_mpi_options, NCCL_DEBUG), and
  Horovod's per-rank HOROVOD_HOSTNAME / LOCAL_RANK / CROSS_RANK ... (instance-relative);
* the instance's code directory as working directory.

It forwards the command's output (stdout and stderr) tagged with the rank's own host and
rank (``[algo-2 rank 3] ``): mpirun runs on algo-1, so every rank's lines reach algo-1's
log; the tag lets the log reader (shipyard.observe.logs) show them under their own host.

Failure: when the command fails on its own (non-zero exit, or a traceback before the job
was torn down) the wrapper writes the failure text (exception line first,
shipyard.runtime.failure) to the job's mpi failure file, first writer wins (O_EXCL): the
earliest failing rank is the root cause; ranks merely killed by the teardown stay silent, and
a rank that exits with a bare code and no traceback (a peer whose MPI connection broke) waits
a moment for a rank with a traceback to claim first.

init watch: shipyard.horovod's ``init()`` touches ``init.<rank>`` then ``ready.<rank>`` in
``$SHIPYARD_MPI_RUN_DIR``. MPI_Init waits for every rank, so a rank that never calls
``hvd.init()`` leaves the others blocked inside MPI (where Python cannot run). This wrapper
sees it from outside: init started, not ready after ``init_timeout`` seconds, it names the
ranks without an ``init`` marker, fails the rank and so the job.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from shipyard import settings
from shipyard.mpi.command import rank_env
from shipyard.runtime import failure
from shipyard.runtime.lifeline import die_with_parent

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
TRACEBACK = "Traceback (most recent call last):"
_TAIL_LINES = 200
_BARE_EXIT_GRACE = 2.0  # seconds a rank failing without a traceback defers to one with it


def rank_tag(host: str, rank: int) -> str:
    """The prefix of every line a rank prints: ``[algo-2 rank 3] ``."""
    return f"[{host} rank {rank}] "


RANK_LINE = re.compile(r"^\[algo-\d+ rank \d+\] ")


def world_rank(env: dict[str, str] | os._Environ) -> int:
    for key in RANK_VARS:
        if env.get(key, "") != "":
            return int(env[key])
    raise SystemExit("shipyard mpi_rank: not started by mpirun (no OMPI_COMM_WORLD_RANK)")


def load_env(path: str, timeout: float, attempt: str = "") -> dict[str, str] | None:
    """An instance's planned environment for this job attempt (``SHIPYARD_ATTEMPT``),
    waiting up to ``timeout`` s for its agent to write it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, encoding="utf-8") as fh:
                env = json.load(fh)
            if env.get("SHIPYARD_ATTEMPT", "") == attempt:
                return env
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def rank_environment(
    instance_env: dict[str, str],
    master_env: dict[str, str],
    current: dict[str, str] | os._Environ,
    hosts: list[str],
    processes_per_host: int,
    rank: int,
) -> dict[str, str]:
    """Instance env < what mpirun set or changed (vs the master's planned env) < HOROVOD_*."""
    env = dict(instance_env)
    env.update({k: v for k, v in current.items() if master_env.get(k) != v})
    env.update(rank_env(hosts, processes_per_host, rank))
    return env


def trim_traceback(lines: list[str]) -> list[str]:
    """Cut what follows the last traceback's exception line (MPI_ABORT banners, abort
    notices), so the exception line is what failure.error_excerpt reports."""
    starts = [i for i, ln in enumerate(lines) if ln.startswith(TRACEBACK)]
    if not starts:
        return lines
    for j in range(starts[-1] + 1, len(lines)):
        if lines[j].strip() and not lines[j].startswith((" ", "\t")):
            return lines[: j + 1]
    return lines


def claim_failure(path: str, text: str) -> bool:
    """Write the job's failure text unless an earlier rank already did."""
    return failure.claim(path, text[: failure.LIMIT])


class Pump(threading.Thread):
    """Copies one output stream of the command, tagged, and keeps its tail."""

    def __init__(self, source: IO[bytes], sink: IO[str], tag: str) -> None:
        super().__init__(daemon=True)
        self.source, self.sink, self.tag = source, sink, tag
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)

    def run(self) -> None:
        for raw in iter(self.source.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            self.sink.write(f"{self.tag}{line}\n")
            self.sink.flush()


class RankWrapper:
    def __init__(self, plan: dict, command: list[str], rank: int) -> None:
        self.plan = plan
        self.command = command
        self.rank = rank
        self.host = plan["hosts"][rank // plan["processes_per_host"]]
        self.signalled = False
        self.proc: subprocess.Popen | None = None

    def marker(self, stage: str, rank: int | None = None) -> str:
        return os.path.join(self.plan["run_dir"], f"{stage}.{self.rank if rank is None else rank}")

    def fail(self, text: str) -> int:
        claim_failure(self.plan["failure_file"], f"rank {self.rank} ({self.host}): {text}")
        sys.stderr.write(f"{rank_tag(self.host, self.rank)}shipyard: {text}\n")
        sys.stderr.flush()
        return 1

    def on_signal(self, signum: int, _frame=None) -> None:
        self.signalled = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def run(self) -> int:
        plan = self.plan
        instance_dir = os.path.join(plan["instances_dir"], self.host)
        attempt = plan.get("attempt", "")
        instance_env = load_env(
            os.path.join(instance_dir, "agent", plan["env_file"]), plan["env_timeout"], attempt
        )
        master_env = load_env(plan["master_env"], 0, attempt)
        if instance_env is None or master_env is None:
            return self.fail(
                f"instance {self.host} did not plan its environment within "
                f"{plan['env_timeout']:.0f} s (its agent did not start?)"
            )
        env = rank_environment(
            instance_env,
            master_env,
            os.environ,
            plan["hosts"],
            plan["processes_per_host"],
            self.rank,
        )
        env["SHIPYARD_MPI_RUN_DIR"] = plan["run_dir"]
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.proc = subprocess.Popen(
            self.command,
            env=env,
            # the tree as the instance sees it (/opt/ml inside an instance sandbox)
            cwd=os.path.join(instance_env.get("SAGEMAKER_BASE_DIR") or instance_dir, "code"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,
        )  # noqa: PLW1509 - no threads yet
        assert self.proc.stdout is not None and self.proc.stderr is not None
        pumps = [
            Pump(self.proc.stdout, sys.stdout, rank_tag(self.host, self.rank)),
            Pump(self.proc.stderr, sys.stderr, rank_tag(self.host, self.rank)),
        ]
        for pump in pumps:
            pump.start()
        stalled = self.watch_init()
        code = self.proc.wait()
        for pump in pumps:
            pump.join(timeout=5)
        if stalled:
            return self.fail(stalled)
        if code == 0:
            return 0
        err, out = list(pumps[1].tail), list(pumps[0].tail)
        lines = trim_traceback(err if err else out)
        has_traceback = any(ln.startswith(TRACEBACK) for ln in lines)
        # not a casualty of the job's teardown; a bare exit code waits for better evidence
        own = not self.signalled and (has_traceback or self.still_own_after(_BARE_EXIT_GRACE))
        if own or has_traceback:
            text = failure.failure_text(code, self.command, "\n".join(lines))
            claim_failure(plan["failure_file"], f"rank {self.rank} ({self.host}): {text}")
        return code if code > 0 else 128 - code

    def still_own_after(self, grace: float) -> bool:
        """Whether a failure with no traceback is still this rank's own after ``grace`` s.

        When one rank raises, its peers' MPI connections break and some exit at once with a
        bare code (Open MPI's 14) and nothing on stderr, sometimes before the raising rank's
        wrapper has read its traceback. Such a peer waits: if a rank with evidence claims the
        failure meanwhile, or the teardown signals this one, it was a casualty."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.signalled or os.path.exists(self.plan["failure_file"]):
                return False
            time.sleep(0.05)
        return not self.signalled

    def watch_init(self) -> str | None:
        """Wait for the command; if it began hvd.init() but is not through it after
        init_timeout, stop it and return the message naming the ranks that never came."""
        timeout = float(self.plan["init_timeout"])
        begun: float | None = None
        proc = self.proc
        assert proc is not None
        while proc.poll() is None:
            time.sleep(0.1)
            if timeout <= 0 or self.signalled:
                continue
            if begun is None:
                if os.path.exists(self.marker("init")):
                    begun = time.monotonic()
                continue
            if os.path.exists(self.marker("ready")) or time.monotonic() - begun < timeout:
                continue
            size = len(self.plan["hosts"]) * self.plan["processes_per_host"]
            missing = [r for r in range(size) if not os.path.exists(self.marker("init", r))]
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
            who = (
                f"rank(s) {missing} never called hvd.init()"
                if missing
                else "every rank called hvd.init() but MPI could not connect them"
            )
            return (
                f"HorovodInitTimeout: rank {self.rank} waited {timeout:.0f} s in hvd.init(): "
                f"{who} (SHIPYARD_HOROVOD_INIT_TIMEOUT={timeout:g})"
            )
        return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m shipyard.mpi.rank --plan FILE -- COMMAND...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m shipyard.mpi.rank")
    parser.add_argument("--plan", required=True)
    args = parser.parse_args(argv[:split])
    # If mpirun's daemon dies without stopping us (SIGKILL), stop too: the command follows
    # (its own PDEATHSIG), so no rank outlives the launcher.
    die_with_parent(signal.SIGTERM)
    # a rank on a serving instance (mpi_rsh): that instance's copy of the plan, own paths
    with open(settings.get("SHIPYARD_MPI_PLAN") or args.plan, encoding="utf-8") as fh:
        plan = json.load(fh)
    return RankWrapper(plan, argv[split + 1 :], world_rank(os.environ)).run()


if __name__ == "__main__":
    sys.exit(main())
