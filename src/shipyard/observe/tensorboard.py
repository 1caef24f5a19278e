"""``shipyard tensorboard JOB [JOB...]``: TensorBoard over one or several jobs' logs,
each job one run group (``--logdir_spec job:dir,...``), so runs can be compared.

A job's logs are found where its ``tensorboard_output_config`` synced them
(``<S3OutputPath>/<job>/tensorboard-output``: a local path is read in place, an s3://
one is copied to ``<job dir>/tensorboard-download`` first), else in the instances'
own trees on this host (``<job dir>/instances/algo-k/output/tensorboard``), which is
where a job started without the config leaves what its script wrote there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass

from shipyard.errors import ShipyardError
from shipyard.spec import JobSpec

EVENT_MARK = "tfevents"


class NoTensorBoardOutputError(ShipyardError):
    """The job wrote no TensorBoard event files anywhere shipyard looks."""


def has_events(path: str) -> bool:
    for _, _, files in os.walk(path):
        if any(EVENT_MARK in f for f in files):
            return True
    return False


@dataclass(frozen=True)
class JobLogs:
    job: str
    logdir: str


def job_logdir(job: str, job_dir: str, spec: JobSpec) -> JobLogs:
    """Where ``job``'s TensorBoard event files are on this machine (see the module doc)."""
    from shipyard import storage

    looked: list[str] = []
    tb = spec.tensorboard
    if tb:
        loc = storage.parse(tb.output_uri(job))
        if loc.scheme == "file":
            looked.append(loc.path)
            if os.path.isdir(loc.path) and has_events(loc.path):
                return JobLogs(job, loc.path)
        else:
            target = os.path.join(job_dir, "tensorboard-download")
            looked.append(loc.uri)
            store = storage.store_for(loc)
            try:
                objects = store.list(loc)
            except ShipyardError:
                objects = []
            for obj in objects:
                dest = os.path.join(target, obj.location.key[len(loc.key) :].lstrip("/"))
                if not os.path.exists(dest) or os.path.getsize(dest) != obj.size:
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    store.download(obj, dest)
            if objects and has_events(target):
                return JobLogs(job, target)
    instances = os.path.join(job_dir, "instances")
    local = tb.local_path if tb else None
    rel = "output/tensorboard"
    if local and local.startswith("/opt/ml/"):
        rel = local[len("/opt/ml/") :]
    hosts = sorted(os.listdir(instances)) if os.path.isdir(instances) else []
    dirs = [os.path.join(instances, h, rel) for h in hosts]
    looked += [os.path.join(instances, "algo-*", rel)]
    with_events = [d for d in dirs if os.path.isdir(d) and has_events(d)]
    if len(with_events) == 1:
        return JobLogs(job, with_events[0])
    if with_events:  # one run per instance below the job's directory
        return JobLogs(job, instances)
    raise NoTensorBoardOutputError(
        f"job {job!r} has no TensorBoard output (no event files in {', '.join(looked)}); "
        "give the estimator tensorboard_output_config=TensorBoardOutputConfig(s3_output_path=...) "
        "and write summaries to /opt/ml/output/tensorboard"
    )


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def command(logs: list[JobLogs], host: str, port: int) -> list[str]:
    spec = ",".join(f"{j.job}:{j.logdir}" for j in logs)
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir_spec",
        spec,
        "--host",
        host,
        "--port",
        str(port),
        "--reload_interval",
        "5",
    ]


def start(logs: list[JobLogs], host: str, port: int) -> subprocess.Popen:
    """TensorBoard as a child process (dies with us: the CLI waits on it)."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.Popen(command(logs, host, port), env=env, stdin=subprocess.DEVNULL)
