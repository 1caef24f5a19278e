"""How late the supervisor notices its instances' end (issue 40): the attempt's wait loop.

    python benchmarks/exit_notice.py [--runs 15] [--instances 4]
    python benchmarks/exit_notice.py --trees before=/tmp/a/src,after=/tmp/b/src

Per run: ``Attempt.monitor`` (shipyard.control.attempt, the real loop) watches
``--instances`` child processes (``sleep`` of a random 0.1-0.3 s, so an exit does not
line up with the loop's timer) through a minimal local backend (``Popen.poll``); a thread
of the benchmark waits on each child's pidfd and notes when the last one exited. The
figure is the time from that exit to ``monitor`` returning (the job's end seen), and
how many times the loop waited (its wake-ups). With ``--trees`` each source tree runs
in its own process, interleaved, so an A/B of two versions is one sitting. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import statistics
import subprocess
import sys
import threading
import time
import types

sys.path.insert(0, os.path.dirname(__file__))


class _Backend:
    """The local backend's part the loop uses: each instance a child, polled."""

    name = "bench"

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}

    def launch(self, specs: list) -> list:
        from shipyard.backends.api import InstanceHandle

        handles = []
        for spec in specs:
            proc = subprocess.Popen(["sleep", f"{random.uniform(0.1, 0.3):.3f}"])
            self.procs[proc.pid] = proc
            handles.append(InstanceHandle(spec.host, proc.pid, os.devnull))
        return handles

    def poll(self, handle) -> int | None:  # type: ignore[no-untyped-def]
        return self.procs[handle.pid].poll()

    def stop(self, handles: list, grace: float) -> None:
        for handle in handles:
            self.procs[handle.pid].kill()
            self.procs[handle.pid].wait()


class _Store:
    """What the loop records goes nowhere: only its timing is measured."""

    def record_instances(self, records: list) -> None:
        pass

    def record_instance(self, record: object) -> None:
        pass

    def get(self, name: str) -> object:
        return types.SimpleNamespace(stop_requested=False)


def one_tree(runs: int, instances: int) -> dict[str, list[float]]:
    """``runs`` attempts with the shipyard on sys.path: per run, ms from the last exit
    to the loop's return, and the loop's waits."""
    from shipyard.control import attempt as attempt_module
    from shipyard.control.attempt import Attempt, JobContext
    from shipyard.control.policies import (
        FailurePolicy,
        MaxRunPolicy,
        Policies,
        RetryPolicy,
        StopPolicy,
    )

    hosts = [f"algo-{i}" for i in range(1, instances + 1)]
    record = types.SimpleNamespace(
        name="bench", spec=types.SimpleNamespace(hosts=hosts), job_dir=os.devnull, subnet=None
    )
    home = types.SimpleNamespace(log_path=lambda name, host: os.devnull + ".log")
    policies = Policies(RetryPolicy(0), FailurePolicy(0.1), StopPolicy(grace=0.1), MaxRunPolicy(60))
    waits = {"n": 0}
    real_sleep = attempt_module.time.sleep

    def counted_sleep(seconds: float) -> None:  # the old loop's wait
        waits["n"] += 1
        real_sleep(seconds)

    attempt_module.time = types.SimpleNamespace(  # type: ignore[assignment]
        sleep=counted_sleep, monotonic=time.monotonic, time=time.time
    )
    exits = sys.modules.get("shipyard.control.exits")
    if exits is not None:  # the new loop's wait
        real_wait = exits.ExitWatch.wait

        def counted_wait(self, timeout, hosts):  # type: ignore[no-untyped-def]
            waits["n"] += 1
            return real_wait(self, timeout, hosts)

        exits.ExitWatch.wait = counted_wait  # type: ignore[method-assign]
    late, woke = [], []
    for _ in range(runs):
        job = JobContext(
            home, _Store(), record, _Backend(), policies, [], set(hosts), None, lambda: False
        )  # type: ignore[arg-type]
        attempt = Attempt(job, 1)
        attempt.launch({})
        fds = [os.pidfd_open(h.pid) for h in attempt.handles]
        last: dict[str, float] = {}

        def watch(fds: list[int] = fds, last: dict[str, float] = last) -> None:
            for fd in fds:
                select.select([fd], [], [])
            last["t"] = time.perf_counter()

        watcher = threading.Thread(target=watch)
        watcher.start()
        waits["n"] = 0
        attempt.monitor()
        seen = time.perf_counter()
        watcher.join()
        for fd in fds:
            os.close(fd)
        late.append((seen - last["t"]) * 1000)
        woke.append(float(waits["n"]))
    return {"late_ms": late, "waits": woke}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--trees", default="", help="LABEL=SRC,...: an A/B of source trees")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one batch, in the tree on PYTHONPATH
        print(json.dumps(one_tree(args.runs, args.instances)))
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    trees = dict(t.split("=", 1) for t in args.trees.split(",") if t.strip()) or {"": here}
    got: dict[str, dict[str, list[float]]] = {
        label: {"late_ms": [], "waits": []} for label in trees
    }
    batch = 3
    for _ in range(0, args.runs, batch):  # interleaved: a few runs of each tree in turn
        for label, src in trees.items():
            env = dict(os.environ, PYTHONPATH=src)
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "--runs",
                    str(batch),
                    "--instances",
                    str(args.instances),
                ],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for key, values in json.loads(out.splitlines()[-1]).items():
                got[label][key].extend(values)
    from _result import result

    figures: dict[str, float] = {}
    for label, values in got.items():
        late = statistics.median(values["late_ms"])
        waits = statistics.median(values["waits"])
        name = label or "tree"
        print(
            f"{name}: the end seen {late:.2f} ms after the last exit (median of "
            f"{len(values['late_ms'])}, max {max(values['late_ms']):.2f}); "
            f"{waits:.0f} waits per attempt"
        )
        key = f"_{label}" if label else ""
        figures[f"late_ms{key}"] = late
        figures[f"waits{key}"] = waits
    result("exit_notice", instances=args.instances, **figures)


if __name__ == "__main__":
    main()
