"""``python -m shipyard.backends.ray.keeper``: one instance's root process on its Ray node.

The actor starts the keeper, and the keeper starts the agent exactly as the local backend
does (its own session, PDEATHSIG, stopped with SIGTERM, a grace period, then SIGKILL of
its whole tree). Why a process between actor and agent: when the actor dies (ray.kill,
its worker or raylet killed, the supervisor's driver gone), no Ray code of the job runs
on that node any more; the keeper still stops the agent and deletes the instance's
files, so nothing of the job is left on the node.

Ray SIGKILLs a dead worker's children and its process group, so the keeper is two
processes: a *waiter* (the actor's child, which the actor waits on and signals) and the
*keeper proper*, forked off in a session of its own, which Ray's cleanup does not reach.
The keeper proper watches the actor's process itself and writes its exit status to a
file; the waiter returns it. Exit status: the agent's (128+N when it ended by signal N).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import psutil

from shipyard.backends.api import LaunchSpec
from shipyard.backends.local import LocalBackend
from shipyard.backends.ray.node import NodeLayout
from shipyard.jobplan.layout import InstancePaths

EXIT_FILE = "keeper.exit"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def keep(layout: NodeLayout, job: str, host: str, grace: float, actor: psutil.Process) -> int:
    """Run the agent until it ends, a stop is asked, or the actor is gone."""
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _f: stop.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _f: stop.append(signum))
    backend = LocalBackend()
    [handle] = backend.launch(
        [LaunchSpec(job, host, layout.config_path, layout.log_path, dict(os.environ))]
    )
    delay = 0.005
    while (code := backend.poll(handle)) is None:
        if stop or not _alive(actor):
            backend.stop([handle], grace=grace)
            code = backend.poll(handle)
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    if code is None:
        return 137
    note_resource_failure(layout, backend.resource_failure(handle))
    return 128 - code if code < 0 else code


def note_resource_failure(layout: NodeLayout, verdict: str | None) -> None:
    """The kernel's word on why the instance ended (its cgroup's memory or process limit on
    this node), put first in its failure file, which goes back to the submitting machine:
    the local backend's supervisor asks the backend for it, but on Ray only the keeper, on
    the node, can read the cgroup before it is gone."""
    if not verdict:
        return
    path = InstancePaths(layout.tree).failure_file
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        text = ""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(f"{verdict}\n{text}" if text else verdict)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.backends.ray.keeper")
    parser.add_argument("--job", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--grace", type=float, default=5.0)
    args = parser.parse_args(argv)
    layout = NodeLayout.for_instance(args.job, args.host)
    actor = psutil.Process(os.getppid())
    exit_file = os.path.join(layout.stage, EXIT_FILE)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the keeper proper
        os.close(read_end)
        os.setsid()
        code = 1
        try:
            code = keep(layout, args.job, args.host, args.grace, actor)
            if _alive(actor):
                with open(exit_file + ".tmp", "w") as fh:
                    fh.write(str(code))
                os.replace(exit_file + ".tmp", exit_file)
            else:  # the actor is gone: nobody will collect; leave nothing
                layout.cleanup()
        finally:
            os._exit(code)
    # the waiter: lives as long as the keeper proper, passes stop requests on
    os.close(write_end)
    signal.signal(signal.SIGTERM, lambda signum, _f: _forward(child, signum))
    signal.signal(signal.SIGINT, lambda signum, _f: _forward(child, signum))
    while os.read(read_end, 1):
        pass
    try:
        os.waitpid(child, 0)
    except ChildProcessError:
        pass
    try:
        with open(exit_file) as fh:
            return int(fh.read().strip() or 1)
    except (OSError, ValueError):
        return 137


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
