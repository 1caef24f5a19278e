"""``python -m shipyard.backends.ray_keeper``: one instance's root process on its Ray node.

The actor starts this keeper (with PR_SET_PDEATHSIG), and the keeper starts the agent
exactly as the local backend does (its own session, PDEATHSIG, stopped with SIGTERM, a
grace period, then SIGKILL of its whole tree). Why a process between actor and agent:
when the actor dies (ray.kill, its worker or raylet killed, the supervisor's driver
gone), no Ray code runs any more on that node for the job; the keeper still gets its
SIGTERM, stops the agent and deletes the instance's files, so nothing of the job is left
on the node. Exit status: the agent's (128+N when it ended by signal N).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from shipyard.backends.api import LaunchSpec
from shipyard.backends.local import LocalBackend
from shipyard.backends.ray_node import NodeLayout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.backends.ray_keeper")
    parser.add_argument("--job", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--grace", type=float, default=5.0)
    args = parser.parse_args(argv)
    layout = NodeLayout.for_instance(args.job, args.host)
    parent = os.getppid()
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _f: stop.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _f: stop.append(signum))
    backend = LocalBackend()
    [handle] = backend.launch([LaunchSpec(args.job, args.host, layout.config_path,
                                          layout.log_path, dict(os.environ))])
    delay = 0.005
    while (code := backend.poll(handle)) is None:
        if stop or os.getppid() != parent:
            backend.stop([handle], grace=args.grace)
            code = backend.poll(handle)
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    code = 128 - code if code is not None and code < 0 else (code if code is not None else 137)
    if os.getppid() != parent:  # the actor is gone: nobody will collect; leave nothing
        layout.cleanup()
    return code


if __name__ == "__main__":
    sys.exit(main())
