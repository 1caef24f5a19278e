"""``python -m shipyard.tf.chief --report R --placement P --ps IP:PORT,... -- <user argv>``.

Runs the user's script as the parameter_server job's chief (master in the SageMaker
layout), then, once it has ended and while every ps still serves, asks each ps relay
for its traffic counters, merges them with the variable placement the script's
process recorded, writes the report to ``SHIPYARD_REPORT_PATH`` and logs a summary
(with the "nothing was placed on a ps" warning when it applies). Exits with the
script's status; nothing here may turn a script's success into a failure, and after
a failure it prints nothing that would bury the script's traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shipyard import settings
from shipyard.tf import placement, report
from shipyard.tf.server import SECRET_ENV, log


def run_script(argv: list[str], placement_file: str) -> int:
    from shipyard.runtime.lifeline import die_with_parent

    env = dict(os.environ)
    env.pop(SECRET_ENV, None)  # the user's script has no use for the job secret
    env[placement.PLACEMENT_ENV] = placement_file  # the hook records in the script only
    proc = subprocess.Popen(argv, env=env, preexec_fn=die_with_parent)

    def forward(signum, _frame):
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return proc.wait()


def collect(endpoints: list[str], secret: str) -> list[dict[str, Any] | None]:
    from shipyard.runtime.traffic import fetch_stats

    def one(endpoint: str) -> dict[str, Any] | None:
        host, _, port = endpoint.rpartition(":")
        try:
            return fetch_stats((host, int(port)), secret, timeout=3.0)
        except (OSError, ValueError):
            return None

    with ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        return list(pool.map(one, endpoints))


def write_json(path: str, data: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m shipyard.tf.chief")
    parser.add_argument("--report", required=True)
    parser.add_argument("--placement", required=True)
    parser.add_argument("--ps", required=True, help="public ps endpoints, comma-separated")
    parser.add_argument("--hosts", required=True, help="the ps hosts, comma-separated")
    parser.add_argument("--layout", required=True)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    code = run_script(command, args.placement)
    try:
        endpoints = args.ps.split(",")
        stats = collect(endpoints, settings.get(SECRET_ENV) or "")
        data = report.build(
            placement.read(args.placement),
            endpoints,
            args.hosts.split(","),
            stats,
            args.layout,
            script_ok=code == 0,
        )
        os.makedirs(os.path.dirname(args.report), exist_ok=True)
        write_json(args.report, data)
    except Exception as exc:  # noqa: BLE001 - the report is a bonus; the script's result is the job's
        if code == 0:
            log(f"could not build the placement/traffic report: {type(exc).__name__}: {exc}")
        return code
    if code == 0:
        for line in report.summary_lines(data):
            log(line)
        log(f"placement and traffic report: {args.report} (shipyard describe shows it)")
    return code


if __name__ == "__main__":
    sys.exit(main())
