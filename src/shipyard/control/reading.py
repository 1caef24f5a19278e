"""JobReader: the read side of the control plane (get, list, describe, logs, stop, wait).

Why a class of its own: `shipyard jobs`, `describe`, `logs`, `stop` and `metrics` only read
the store (and stop asks a supervisor to stop), yet through ``ControlPlane`` they started
staging, the backends, the runners and pydantic (0.3-0.4 s of CPU before any work, issue
40). This module imports only the store, the lifecycle and the home; what a rare path
needs (psutil for a job still running, the backends to stop the instances of a job whose
supervisor died) is imported there. ``ControlPlane`` is a JobReader that also submits and
runs jobs, so the SDK, the server and the dashboard read through the same code.

describe() reads the spec as stored (``record.spec_data``, plain JSON dumped from a
validated JobSpec), never the model: the same DescribeTrainingJob answer for every
caller, without validating the spec for the CLI.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from typing import Any, TextIO

from shipyard.control.home import Home
from shipyard.control.lifecycle import Event, InstanceStatus, JobStatus, SecondaryStatus
from shipyard.control.store import JobRecord, Store, Transition
from shipyard.errors import JobFailedError

# the framework environment a job ran in, written beside its record (control.envphase)
FRAMEWORK_ENV_NAME = "framework-environment.json"


def framework_environment(job_dir: str) -> dict[str, Any] | None:
    """The job's ``Shipyard.FrameworkEnvironment`` record (what was asked, what ran, in
    which Python, why), or None when the job asked for none or it cannot be read."""
    try:
        with open(os.path.join(job_dir, FRAMEWORK_ENV_NAME), encoding="utf-8") as fh:
            env = json.load(fh)
    except (OSError, ValueError):
        return None
    return env if isinstance(env, dict) else None


def host_names(spec_data: dict[str, Any]) -> list[str]:
    """The job's hosts, algo-1..N, from the spec as stored (spec.host_names' rule)."""
    return [f"algo-{i}" for i in range(1, int(spec_data.get("instance_count", 1)) + 1)]


class JobReader:
    """Reads jobs from the store under ``home`` (SHIPYARD_HOME by default).
    ``validate``: records come back with their spec validated (the SDK's and
    the server's ControlPlane), or as stored (the CLI's read-only commands)."""

    validate = True

    def __init__(self, home: str | None = None, backend: str = "local") -> None:
        self.home = Home.from_env(home)
        self.home.ensure_private()
        self.store = Store(self.home.db_path)
        self.backend = backend

    def stop(self, name: str, wait: bool = True, timeout: float = 60) -> JobRecord:
        record = self.reconcile(self.store.get(name, self.validate))
        if record.terminal:
            return record
        self.store.request_stop(name)
        if not wait:
            return self.store.get(name, self.validate)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.reconcile(self.store.get(name, self.validate))
            if record.terminal:
                return record
            time.sleep(0.1)
        return record

    def wait(
        self,
        name: str,
        logs: bool = True,
        stream: TextIO | None = None,
        host: str | None = None,
        show_noise: bool | None = None,
    ) -> JobRecord:
        """Follow a job run by another process until it ends (attach, logs --follow);
        ``host``: only that instance's lines (its MPI ranks' included)."""
        from shipyard.observe.logs import LogTailer, print_lines, select

        stream = stream or sys.stdout
        tailer = LogTailer({}, index=False)  # the supervisor keeps the times
        while True:
            record = self.reconcile(self.store.get(name, self.validate))
            for key, path in self.log_files(name).items():
                tailer.add(key, path)
            lines = tailer.poll(flush=record.terminal)
            if logs:
                print_lines(select(lines, host), stream, show_noise=show_noise)
            if record.terminal:
                return record
            time.sleep(0.1)

    def reconcile(self, record: JobRecord) -> JobRecord:
        """A job whose supervisor died is marked Failed, and its instances are stopped."""
        if record.terminal or record.supervisor_pid is None:
            return record
        if _alive(record.supervisor_pid, record.supervisor_started):
            return record
        record = self.store.get(record.name, self.validate)  # it may have just finished
        if record.terminal:
            return record
        from shipyard.backends import get as get_backend
        from shipyard.backends.api import InstanceHandle
        from shipyard.control import artifacts

        handles = [
            InstanceHandle(i.host, i.pid, i.log_path or "")
            for i in self.store.instances(record.name, record.attempt)
            if i.pid and _is_agent(i.pid, record.job_dir)
        ]
        if handles:
            get_backend(record.backend).stop(handles, grace=2.0)
        self.store.close_running_instances(
            record.name, InstanceStatus.STOPPED, "stopped when the job's supervisor was found gone"
        )
        reason = (
            f"InternalServerError: the process supervising this job (pid "
            f"{record.supervisor_pid}) ended unexpectedly; its instances were stopped"
        )
        if record.secondary_status in (SecondaryStatus.UPLOADING, SecondaryStatus.STOPPING):
            removed = artifacts.discard_partial(
                record.spec_data.get("output_path") or self.home.default_output_path,
                record.name,
                record.job_dir,
            )
            if record.secondary_status is SecondaryStatus.UPLOADING:
                reason = (
                    f"InternalServerError: the upload of the model artifacts was interrupted "
                    f"(the process supervising this job, pid {record.supervisor_pid}, ended "
                    "while uploading); every instance had completed, but the artifacts are "
                    f"incomplete ({len(removed)} partial file(s) removed). Run the job again."
                )
        if record.stop_requested:
            self.store.transition(record.name, Event.STOP_REQUESTED, "Stop requested")
            return self.store.transition(record.name, Event.STOPPED, "Training job stopped")
        return self.store.transition(
            record.name, Event.FAILED, "Supervisor lost", failure_reason=reason
        )

    # -- reading --------------------------------------------------------------------------
    def get(self, name: str) -> JobRecord:
        return self.reconcile(self.store.get(name, self.validate))

    def list(self, limit: int = 100) -> list[JobRecord]:
        return [self.reconcile(r) for r in self.store.list(limit, self.validate)]

    def describe(self, name: str, utilization: bool = True) -> dict[str, Any]:
        """DescribeTrainingJob's answer; ``utilization=False`` leaves out
        ``Shipyard.Utilization`` (a day-long job's samples are megabytes to parse, and a
        page polling every second asks for them a page at a time instead)."""
        return describe(self, self.get(name), utilization)

    def log_files(self, name: str, host: str | None = None) -> dict[str, str]:
        files = {}
        for inst in self.store.instances(name):
            if host and inst.host != host:
                continue
            key = inst.host if inst.attempt == 1 else f"{inst.host}#{inst.attempt}"
            if inst.log_path:
                files[key] = inst.log_path
        return files

    def raise_for_status(self, record: JobRecord) -> None:
        if record.status is JobStatus.FAILED:
            raise JobFailedError(record.name, record.status, record.failure_reason)


def _alive(pid: int, started: float | None = None) -> bool:
    """Process ``pid`` runs, and is the one that started at ``started`` (when recorded): a
    pid the kernel reused for another process does not keep a dead job alive."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 0.05
    except psutil.Error:
        return False


def _is_agent(pid: int, job_dir: str) -> bool:
    import psutil

    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "shipyard.agent" in cmd and any(job_dir in part for part in cmd)


def _ts(value: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, tz=dt.timezone.utc) if value else None


def describe(cp: JobReader, record: JobRecord, utilization: bool = True) -> dict[str, Any]:
    """A SageMaker DescribeTrainingJob-shaped dict (datetimes as in boto3)."""
    from shipyard.observe.metrics import final_metrics

    spec = record.spec_data
    metrics = cp.store.metrics(record.name)
    final = [dict(m, Timestamp=_ts(m["Timestamp"])) for m in final_metrics(metrics)]
    out: dict[str, Any] = {
        "TrainingJobName": record.name,
        "TrainingJobArn": f"arn:shipyard:local:training-job/{record.name}",
        "TrainingJobStatus": record.status,
        "SecondaryStatus": record.secondary_status,
        "HyperParameters": dict(record.hyperparameters),
        "AlgorithmSpecification": {
            "TrainingImage": spec.get("framework") or "shipyard-generic",
            "TrainingInputMode": spec.get("input_mode", "File"),
            "MetricDefinitions": [
                {"Name": m["Name"], "Regex": m["Regex"]} for m in spec.get("metric_definitions", [])
            ],
            "EnableSageMakerMetricsTimeSeries": False,
        },
        "RoleArn": spec.get("role") or "",
        "InputDataConfig": _input_data_config(spec),
        "OutputDataConfig": {"S3OutputPath": spec.get("output_path")},
        "ResourceConfig": {
            "InstanceType": spec.get("instance_type", "local"),
            "InstanceCount": spec.get("instance_count", 1),
            "VolumeSizeInGB": spec.get("volume_size_gb", 30),
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": spec.get("max_run", 24 * 60 * 60)},
        "CreationTime": _ts(record.created_at),
        "TrainingStartTime": _ts(record.start_time),
        "TrainingEndTime": _ts(record.end_time),
        "LastModifiedTime": _ts(record.modified_at),
        "SecondaryStatusTransitions": _transitions(cp.store.transitions(record.name), record),
        "FinalMetricDataList": final,
        "Environment": dict(spec.get("environment", {})),
        "RetryStrategy": {"MaximumRetryAttempts": spec.get("max_retry_attempts", 0)},
        "EnableNetworkIsolation": spec.get("enable_network_isolation", False),
        "Tags": [dict(t) for t in spec.get("tags", [])],
        "Shipyard": _shipyard_section(cp, record, utilization),
    }
    if record.failure_reason:
        out["FailureReason"] = record.failure_reason
    if record.model_artifact:
        out["ModelArtifacts"] = {"S3ModelArtifacts": record.model_artifact}
    if spec.get("checkpoint_s3_uri") or spec.get("checkpoint_local_path"):
        out["CheckpointConfig"] = {
            "S3Uri": spec.get("checkpoint_s3_uri"),
            "LocalPath": spec.get("checkpoint_local_path"),
        }
    if record.start_time:
        end = record.end_time or time.time()
        out["TrainingTimeInSeconds"] = int(round(end - record.start_time))
        out["BillableTimeInSeconds"] = out["TrainingTimeInSeconds"]
    return out


def _transitions(transitions: list[Transition], record: JobRecord) -> list[dict[str, Any]]:
    """SecondaryStatusTransitions: each one ends when the next starts (the last one when
    the job ended)."""
    out = []
    for i, t in enumerate(transitions):
        entry = {
            "Status": t["secondary_status"],
            "StartTime": _ts(t["at"]),
            "StatusMessage": t["message"] or "",
        }
        if i + 1 < len(transitions):
            entry["EndTime"] = _ts(transitions[i + 1]["at"])
        elif record.terminal:
            entry["EndTime"] = _ts(t["at"])
        out.append(entry)
    return out


def _input_data_config(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "ChannelName": ch["name"],
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": ch.get("s3_data_type", "S3Prefix"),
                    "S3Uri": ch["uri"],
                    "S3DataDistributionType": ch.get("distribution", "FullyReplicated"),
                }
            },
            "CompressionType": ch.get("compression") or "None",
            "RecordWrapperType": ch.get("record_wrapping") or "None",
            # the channel's own mode, else the job's (JobSpec.channel_mode)
            "InputMode": ch.get("input_mode") or spec.get("input_mode", "File"),
            **({"ContentType": ch["content_type"]} if ch.get("content_type") else {}),
        }
        for ch in spec.get("channels", [])
    ]


def _shipyard_section(cp: JobReader, record: JobRecord, samples: bool) -> dict[str, Any]:
    """What describe adds beyond SageMaker: where the job lives, its attempts and
    instances, and the distribution report the agents wrote."""
    from shipyard.backends.resources import read_record as read_resources
    from shipyard.control.job_end import (
        REPORT_NAME,
        job_warnings,
        lost_processes,
        missing_protections,
    )
    from shipyard.errors import ValidationError
    from shipyard.observe import utilization
    from shipyard.observe.metrics import history
    from shipyard.sandbox import shaping

    spec = record.spec_data
    hosts = host_names(spec)
    section: dict[str, Any] = {
        "JobDir": record.job_dir,
        "Backend": record.backend,
        # describe's human form leads with these (cli/describe_view.py)
        "Framework": spec.get("framework"),
        "FrameworkVersion": spec.get("framework_version"),
        "PyVersion": spec.get("py_version"),
        "Distribution": dict(spec.get("distribution", {})),
        "Attempts": [
            dict(a, started_at=_ts(a["started_at"]), ended_at=_ts(a["ended_at"]))
            for a in cp.store.attempts(record.name)
        ],
        "Instances": [
            {
                "Host": i.host,
                "Attempt": i.attempt,
                "Address": i.address,
                "Pid": i.pid,
                "Status": i.status,
                "ExitCode": i.exit_code,
                "FailureReason": i.failure_reason,
                "LogPath": i.log_path,
            }
            for i in cp.store.instances(record.name)
        ],
        "OutputArtifacts": record.output_artifact,
        "Warnings": job_warnings(record.job_dir),
        # what each instance got of the machine (CPUs, memory, GPUs), or why no limits
        "Resources": read_resources(record.job_dir),
        # per-instance CPU, memory, disk, network, GPU samples (observe.utilization)
        "Utilization": utilization.by_host(utilization.read(record.job_dir)) if samples else {},
        "LostProcesses": lost_processes(record.job_dir, hosts),
        "MissingProtections": missing_protections(record.job_dir, hosts),
        # every metric_definitions match (FinalMetricDataList keeps the last of each)
        "MetricHistory": [
            dict(h, Timestamp=_ts(h["Timestamp"])) for h in history(cp.store.metrics(record.name))
        ],
    }
    framework_env = framework_environment(record.job_dir)
    if framework_env is not None:  # which framework version ran, and why (environments)
        section["FrameworkEnvironment"] = framework_env
    try:
        shape = shaping.from_tags(spec.get("tags", []), spec.get("instance_type", "local"))
        section["Network"] = shape.describe() if shape else "unshaped"
    except ValidationError as exc:  # a record from before the tag was checked
        section["Network"] = f"unshaped: {exc}"
    report_path = os.path.join(record.job_dir, REPORT_NAME)
    if os.path.isfile(report_path):
        with open(report_path, encoding="utf-8") as fh:
            section["DistributionReport"] = json.load(fh)
        section["DistributionReportPath"] = report_path
    # each timed worker's steps (Keras fit, shipyard.ps), warm-up kept apart (planner.steps)
    from shipyard.control.job_end import instance_paths
    from shipyard.planner import steps

    agent_dirs = {h: instance_paths(record.job_dir, h).agent_dir for h in hosts}
    section["StepTiming"] = steps.summarize(steps.read(record.job_dir, agent_dirs))
    return section
