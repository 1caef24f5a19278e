"""How often a finished two-rank torch DDP job dies at exit, without and with the gloo exit guard.

    python benchmarks/gloo_exit.py [--runs 100]

torch 2.13's gloo worker can still be dropping the last collective's work object (which
needs the GIL) when the script returns; if CPython is finalizing by then, the rank dies of
SIGABRT ("terminate called without an active exception") after its work is done
(docs/decisions.md, "the gloo exit guard"). Each run is the CI test's DDP script
(barrier, then destroy_process_group), two ranks over 127.0.0.1 launched as torchrun
would; "off" runs it bare, "on" with shipyard's job-process ``sitecustomize`` on
PYTHONPATH, as every job process has it. The two alternate run by run so both see the
same machine. A rate, not a timing: run it on a quiet machine, since load shifts the race
(4 ranks on 2 busy cores hid it entirely).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile

from _result import result
from shipyard.runtime import sitehooks

# the CI test's own script: 3 DDP steps, rank 0 saves, barrier, destroy_process_group
SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "tests/integration/server/torch_code/train_ddp.py",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_job(out: str, guard: bool) -> list[int]:
    """Exit codes of the two ranks of one run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    env.update(SM_CURRENT_HOST="algo-1", SM_MODEL_DIR=out)
    if guard:
        env["PYTHONPATH"] = sitehooks.site_dir()
    ranks = [
        subprocess.Popen(
            [sys.executable, SCRIPT],
            env=dict(env, RANK=str(rank), LOCAL_RANK="0"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for rank in (0, 1)
    ]
    return [p.wait(timeout=300) for p in ranks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    failed = {False: 0, True: 0}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for guard in (False, True):
                codes = one_job(tmp, guard)
                if any(codes):
                    failed[guard] += 1
                    print(f"run {i + 1} guard={'on' if guard else 'off'}: exit codes {codes}")
    print(f"failed runs of {args.runs}: guard off {failed[False]}, guard on {failed[True]}")
    result("gloo_exit", runs=args.runs, failed_off=failed[False], failed_on=failed[True])


if __name__ == "__main__":
    main()
