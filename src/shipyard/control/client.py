"""ControlPlane: the one facade the SDK and the CLI talk to (kubeflow/sdk style).

submit() validates everything that can be checked, stages the code and records the
job -- or refuses with a clear error and leaves nothing behind. run() supervises in
the foreground; start() hands the job to a detached supervisor process.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, TextIO

import psutil

from shipyard import backends, instance_types
from shipyard import distribution as dist_mod
from shipyard.agent import runners
from shipyard.backends.resources import read_record as read_resources
from shipyard.control import artifacts, envphase, legacy_mode, plan, staging, versions
from shipyard.control.home import Home
from shipyard.control.interrupt import terminate_as_interrupt
from shipyard.control.job_end import (
    REPORT_NAME,
    job_warnings,
    lost_processes,
    missing_protections,
)
from shipyard.control.lifecycle import Event, InstanceStatus, JobStatus, SecondaryStatus
from shipyard.control.store import JobRecord, Store, Transition
from shipyard.environments import job as framework_envs
from shipyard.errors import (
    ChannelError,
    DistributionError,
    JobExistsError,
    JobFailedError,
    StorageError,
    ValidationError,
)
from shipyard.observe import utilization
from shipyard.observe.logs import LogTailer, print_lines, select
from shipyard.observe.metrics import final_metrics, history
from shipyard.sandbox import shaping
from shipyard.spec import ChannelSpec, JobSpec

FRAMEWORK_ENV_NAME = envphase.FRAMEWORK_ENV_NAME


def check_runner(spec: JobSpec) -> None:
    """Refuse, at submission, a distribution this build cannot run or options its runner
    rejects (each runner's optional ``validate``), so nothing is half-started."""
    runner = spec.dist.runner_for(spec.framework)
    if spec.dist.kind == dist_mod.SMDDP and spec.framework == "tensorflow":
        refusal = dist_mod.smddp_tensorflow_refusal(spec.framework_version)
        if refusal:
            raise DistributionError(refusal)
    if runner == "tf_parameter_server" and spec.framework not in (None, "tensorflow"):
        raise DistributionError(
            "distribution['parameter_server']['implementation']='tensorflow' needs the "
            f"TensorFlow estimator, not {spec.framework!r}; use 'shipyard' (shipyard.ps)"
        )
    if runner not in runners.available():
        planned = runners.PLANNED.get(runner, "a later release")
        raise DistributionError(
            f"distribution {spec.dist.kind!r} is recognised but its runner is not available "
            f"in this version of shipyard yet (coming with: {planned}); it will not be run as "
            "a plain job. Remove `distribution` to train without it."
        )
    # the options as the runner gets them on the instances (plan.agent_config): with the kind,
    # so a runner serving several kinds names the one the user asked for
    runners.validate(
        runner,
        dict(spec.dist.options, kind=spec.dist.kind),
        spec.instance_count,
        instance_types.resolve(spec.instance_type),
    )


def channel_source(ch: ChannelSpec, mode: str, instance_count: int) -> str:
    """Check one channel against its source and return what the agents read from: an
    absolute local path, or the s3:// URI. Refuses, naming the channel, a source that
    is missing or empty, an unreachable endpoint, and option combinations SageMaker
    rejects (compression / record wrapping outside Pipe mode, FastFile from a manifest)."""
    from shipyard import storage

    if mode != "Pipe" and (ch.compression or ch.record_wrapping):
        raise ChannelError(
            f"channel {ch.name!r}: compression and record_wrapping apply to Pipe mode only "
            f"(SageMaker's rule); this channel is in {mode} mode: drop them or use "
            "input_mode='Pipe'"
        )
    if mode == "FastFile" and ch.s3_data_type != "S3Prefix":
        raise ChannelError(
            f"channel {ch.name!r}: FastFile reads an S3Prefix only; use "
            "File or Pipe mode for a ManifestFile"
        )
    try:
        loc = storage.parse(ch.uri)
        if loc.scheme == "file" and not os.path.exists(loc.path):
            raise ChannelError(f"channel {ch.name!r}: {ch.uri!r} does not exist")
        objects = storage.list_channel(ch.uri, ch.s3_data_type)
    except (ValidationError, StorageError) as exc:
        if isinstance(exc, ChannelError):
            raise
        raise ChannelError(f"channel {ch.name!r}: {exc}") from None
    if ch.distribution == "ShardedByS3Key" and len(objects) < instance_count:
        raise ChannelError(
            f"channel {ch.name!r}: ShardedByS3Key over {instance_count} instances needs at "
            f"least {instance_count} objects, {ch.uri!r} has {len(objects)}; split the data "
            "into more files or use FullyReplicated"
        )
    return loc.uri if loc.scheme == "s3" else loc.path


def check_location(what: str, uri: str) -> str:
    """An output_path / code_location / checkpoint_s3_uri: s3:// (its bucket must exist),
    file:// or a local path. Returns the normalized URI."""
    from shipyard import storage

    try:
        loc = storage.parse(uri)
        if loc.scheme == "s3" and not storage.store_for(loc).bucket_exists(loc):
            raise ValidationError(
                f"{what} {uri!r}: bucket {loc.bucket!r} does not exist at "
                f"{storage.endpoint_url() or 'the default AWS endpoint'}"
            )
    except StorageError as exc:
        raise ValidationError(f"{what} {uri!r}: {exc}") from None
    return loc.uri


class ControlPlane:
    def __init__(self, home: str | None = None, backend: str = "local") -> None:
        self.home = Home.from_env(home)
        self.home.ensure_private()
        self.store = Store(self.home.db_path)
        self.backend = backend

    # -- submission -----------------------------------------------------------------------
    def _framework_env(
        self, spec: JobSpec
    ) -> tuple[framework_envs.Prepared, framework_envs.Request | None]:
        """The framework environment the job's processes run in: the installed one (when
        nothing else is asked, or SHIPYARD_FRAMEWORK_ENVS=off), or a request the job's
        first phase prepares (control.envphase) before any instance starts. Nothing here
        queries the registry or builds: submission returns at once."""
        installed = framework_envs.Prepared(None, None, None)
        if not framework_envs.enabled():
            return installed, None
        matched = framework_envs.installed_match(spec.framework, spec.framework_version)
        if matched is not None:
            return matched, None
        return installed, framework_envs.request(
            spec.framework, spec.framework_version, spec.py_version
        )

    def submit(self, spec: JobSpec, log=None) -> JobRecord:
        """Validate, stage, record. On any error nothing is left but the refusal (a
        SIGTERM meanwhile too: it interrupts like Ctrl-C, and the reservation is undone)."""
        with terminate_as_interrupt():
            return self._submit(spec, log)

    def _submit(self, spec: JobSpec, log=None) -> JobRecord:
        check_runner(spec)
        framework_env, env_request = self._framework_env(spec)
        backends.validate(
            self.backend,
            spec.instance_count,
            spec.instance_type,
            spec.dist.runner_for(spec.framework),
        )
        sources = {
            ch.name: channel_source(ch, spec.channel_mode(ch), spec.instance_count)
            for ch in spec.channels
        }
        if spec.checkpoint_s3_uri:
            check_location("checkpoint_s3_uri", spec.checkpoint_s3_uri)
        if spec.tensorboard:
            check_location(
                "tensorboard_output_config.s3_output_path", spec.tensorboard.s3_output_path
            )
        if self.store.exists(spec.job_name):
            raise JobExistsError(
                f"a training job named {spec.job_name!r} already exists; job names are unique: "
                "pass another job_name or base_job_name"
            )
        output_path = check_location(
            "output_path", spec.output_path or self.home.default_output_path
        )
        if spec.code_location:
            check_location("code_location", spec.code_location)
        spec = spec.model_copy(update={"output_path": output_path})
        job_dir = self.home.job_dir(spec.job_name)
        code_location = spec.code_location or output_path
        # The name is reserved (atomically, with the job's subnet) before anything is
        # staged: of concurrent submits of one name exactly one gets here, the others
        # leave with JobExistsError having touched nothing.
        shape = shaping.from_tags(spec.tags, spec.instance_type)  # bad values refused here
        sandbox = plan.sandbox_config(self.backend, spec.enable_network_isolation)
        if shape is not None:
            sandbox = sandbox.with_network(shape.to_json())
        record = self.store.create_job(
            spec,
            {},
            job_dir,
            self.backend,
            functools.partial(plan.choose_subnet, sandboxed=sandbox.sandboxed),
            owner_pid=os.getpid(),
        )
        try:
            os.makedirs(job_dir)  # exclusive: a directory left by an older job is not reused
        except FileExistsError:
            self.store.delete_job(spec.job_name)
            raise JobExistsError(
                f"job directory {job_dir} already exists (left by an earlier job of that "
                "name?); pick another job name or remove the directory"
            ) from None
        staged = None
        try:
            # staging shows its own progress: bundling and upload bars, pip's spinner
            staged = staging.stage(
                spec.code,
                spec.job_name,
                code_location,
                self.home.requirements_cache,
                local_dir=os.path.join(job_dir, "source"),
                exclude=self._never_bundled(spec, code_location),
                # a framework environment installs requirements.txt in its own resolve
                requirements=env_request is None,
            )
            legacy_mode.check_bundle(staged.bundle_path, staged.entry_point)
            encoded = plan.hyperparameters(spec, staged, self.home)
            assert record.subnet is not None  # chosen with the reservation
            config = plan.agent_config(
                spec,
                staged,
                encoded,
                self.home,
                record.subnet,
                sources,
                sandbox=sandbox,
                python=framework_env.python,
            )
            os.makedirs(os.path.join(job_dir, "logs"))
            if env_request is not None:
                envphase.write_request(job_dir, env_request)
            elif framework_env.resolution is not None:
                with open(os.path.join(job_dir, FRAMEWORK_ENV_NAME), "w") as fh:
                    json.dump(framework_env.describe(), fh)
            with open(os.path.join(job_dir, "job.json"), "w") as fh:
                fh.write(spec.model_dump_json(indent=1))
            # agent.json holds the job's secret: readable by its owner only
            with open(
                os.open(
                    os.path.join(job_dir, "agent.json"),
                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                    0o600,
                ),
                "w",
            ) as fh:
                fh.write(config.to_json())
            if config.shared_dir:
                os.makedirs(os.path.join(config.shared_dir, "model"), exist_ok=True)
            self.store.update(spec.job_name, hyperparameters=encoded)
            record = self.store.get(spec.job_name)
        except BaseException:
            # everything here is this submit's own: the name was reserved above
            shutil.rmtree(job_dir, ignore_errors=True)
            if staged is not None:
                staging.discard(staged)
            self.store.delete_job(spec.job_name)
            raise
        if log:
            log(instance_types.resolve(spec.instance_type).describe())
            if env_request is not None:
                log(
                    f"framework_version {env_request.asked!r} ({env_request.framework}): its "
                    "environment is prepared before the instances start (built with uv on "
                    "first use, then cached)"
                )
            elif framework_env.note:
                log(framework_env.note)
            elif framework_env.python is None:
                for line in versions.notes(spec.framework, spec.framework_version, spec.py_version):
                    log(line)
            for note in staged.notes:
                log(note)
        return record

    def _never_bundled(self, spec: JobSpec, code_location: str) -> tuple[str, ...]:
        """Local directories shipyard writes to: never part of a code bundle, even when a
        user keeps them inside source_dir (the demo puts SHIPYARD_HOME there)."""
        from shipyard import storage

        paths = [self.home.root]
        for uri in (spec.output_path, code_location, spec.checkpoint_s3_uri):
            if uri and not uri.startswith("s3://"):
                paths.append(storage.parse(uri).path)
        return tuple(os.path.abspath(p) for p in paths)

    # -- running --------------------------------------------------------------------------
    def run(self, name: str, stream: TextIO | None = None) -> JobRecord:
        """Supervise the job in this process until it ends. Ctrl-C or SIGTERM stops it
        (status Stopped, every instance gone) and raises KeyboardInterrupt (SIGTERM:
        its subclass :class:`~shipyard.control.interrupt.Terminated`)."""
        from shipyard.control.supervisor import JobSupervisor

        with terminate_as_interrupt():
            self.store.update(name, supervisor_pid=os.getpid())
            self.store.transition(name, Event.DOWNLOADING, "Making input data available")
            return JobSupervisor(self.home, self.store, name, stream=stream).run()

    def start(self, name: str) -> int:
        """Hand the job to a detached supervisor process; returns its pid."""
        self.store.transition(name, Event.DOWNLOADING, "Making input data available")
        log = open(os.path.join(self.home.job_dir(name), "supervisor.log"), "ab")
        with log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shipyard.control.supervisor",
                    "--home",
                    self.home.root,
                    "--job",
                    name,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self.store.update(name, supervisor_pid=proc.pid)
        return proc.pid

    def stop(self, name: str, wait: bool = True, timeout: float = 60) -> JobRecord:
        record = self.reconcile(self.store.get(name))
        if record.terminal:
            return record
        self.store.request_stop(name)
        if not wait:
            return self.store.get(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.reconcile(self.store.get(name))
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
        stream = stream or sys.stdout
        tailer = LogTailer({})
        while True:
            record = self.reconcile(self.store.get(name))
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
        record = self.store.get(record.name)  # it may have just finished
        if record.terminal:
            return record
        from shipyard.backends import get as get_backend
        from shipyard.backends.api import InstanceHandle

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
                record.spec.output_path or self.home.default_output_path,
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
        return self.reconcile(self.store.get(name))

    def list(self, limit: int = 100) -> list[JobRecord]:
        return [self.reconcile(r) for r in self.store.list(limit)]

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
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 0.05
    except psutil.Error:
        return False


def _is_agent(pid: int, job_dir: str) -> bool:
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "shipyard.agent" in cmd and any(job_dir in part for part in cmd)


def _ts(value: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, tz=dt.timezone.utc) if value else None


def describe(cp: ControlPlane, record: JobRecord, utilization: bool = True) -> dict[str, Any]:
    """A SageMaker DescribeTrainingJob-shaped dict (datetimes as in boto3)."""
    spec = record.spec
    metrics = cp.store.metrics(record.name)
    final = [dict(m, Timestamp=_ts(m["Timestamp"])) for m in final_metrics(metrics)]
    out: dict[str, Any] = {
        "TrainingJobName": record.name,
        "TrainingJobArn": f"arn:shipyard:local:training-job/{record.name}",
        "TrainingJobStatus": record.status,
        "SecondaryStatus": record.secondary_status,
        "HyperParameters": dict(record.hyperparameters),
        "AlgorithmSpecification": {
            "TrainingImage": spec.framework or "shipyard-generic",
            "TrainingInputMode": spec.input_mode,
            "MetricDefinitions": [m.model_dump() for m in spec.metric_definitions],
            "EnableSageMakerMetricsTimeSeries": False,
        },
        "RoleArn": spec.role or "",
        "InputDataConfig": _input_data_config(spec),
        "OutputDataConfig": {"S3OutputPath": spec.output_path},
        "ResourceConfig": {
            "InstanceType": spec.instance_type,
            "InstanceCount": spec.instance_count,
            "VolumeSizeInGB": 30,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": spec.max_run},
        "CreationTime": _ts(record.created_at),
        "TrainingStartTime": _ts(record.start_time),
        "TrainingEndTime": _ts(record.end_time),
        "LastModifiedTime": _ts(record.modified_at),
        "SecondaryStatusTransitions": _transitions(cp.store.transitions(record.name), record),
        "FinalMetricDataList": final,
        "Environment": dict(spec.environment),
        "RetryStrategy": {"MaximumRetryAttempts": spec.max_retry_attempts},
        "EnableNetworkIsolation": spec.enable_network_isolation,
        "Tags": [dict(t) for t in spec.tags],
        "Shipyard": _shipyard_section(cp, record, utilization),
    }
    if record.failure_reason:
        out["FailureReason"] = record.failure_reason
    if record.model_artifact:
        out["ModelArtifacts"] = {"S3ModelArtifacts": record.model_artifact}
    if spec.checkpoint_s3_uri or spec.checkpoint_local_path:
        out["CheckpointConfig"] = {
            "S3Uri": spec.checkpoint_s3_uri,
            "LocalPath": spec.checkpoint_local_path,
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


def _input_data_config(spec: JobSpec) -> list[dict[str, Any]]:
    return [
        {
            "ChannelName": ch.name,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": ch.s3_data_type,
                    "S3Uri": ch.uri,
                    "S3DataDistributionType": ch.distribution,
                }
            },
            "CompressionType": ch.compression or "None",
            "RecordWrapperType": ch.record_wrapping or "None",
            "InputMode": spec.channel_mode(ch),
            **({"ContentType": ch.content_type} if ch.content_type else {}),
        }
        for ch in spec.channels
    ]


def _shipyard_section(cp: ControlPlane, record: JobRecord, samples: bool) -> dict[str, Any]:
    """What describe adds beyond SageMaker: where the job lives, its attempts and
    instances, and the distribution report the agents wrote."""
    section: dict[str, Any] = {
        "JobDir": record.job_dir,
        "Backend": record.backend,
        "Distribution": dict(record.spec.distribution),
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
        "LostProcesses": lost_processes(record.job_dir, record.spec.hosts),
        "MissingProtections": missing_protections(record.job_dir, record.spec.hosts),
        # every metric_definitions match (FinalMetricDataList keeps the last of each)
        "MetricHistory": [
            dict(h, Timestamp=_ts(h["Timestamp"])) for h in history(cp.store.metrics(record.name))
        ],
    }
    env_path = os.path.join(record.job_dir, FRAMEWORK_ENV_NAME)
    if os.path.isfile(env_path):  # which framework version ran, and why (environments)
        with open(env_path, encoding="utf-8") as fh:
            section["FrameworkEnvironment"] = json.load(fh)
    try:
        shape = shaping.from_tags(record.spec.tags, record.spec.instance_type)
        section["Network"] = shape.describe() if shape else "unshaped"
    except ValidationError as exc:  # a record from before the tag was checked
        section["Network"] = f"unshaped: {exc}"
    report_path = os.path.join(record.job_dir, REPORT_NAME)
    if os.path.isfile(report_path):
        with open(report_path, encoding="utf-8") as fh:
            section["DistributionReport"] = json.load(fh)
        section["DistributionReportPath"] = report_path
    return section
