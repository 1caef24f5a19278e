"""ControlPlane: the one facade the SDK and the CLI talk to (kubeflow/sdk style).

submit() validates everything that can be checked, stages the code and records the
job -- or refuses with a clear error and leaves nothing behind. run() supervises in
the foreground; start() hands the job to a detached supervisor process.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from typing import TextIO

from shipyard import backends
from shipyard.control import envphase, legacy_mode, plan, staging, versions
from shipyard.control.interrupt import terminate_as_interrupt
from shipyard.control.lifecycle import Event
from shipyard.control.reading import JobReader, describe
from shipyard.control.store import JobRecord
from shipyard.errors import (
    ChannelError,
    JobExistsError,
    StorageError,
    ValidationError,
)
from shipyard.jobplan.plan import JobPlan, build
from shipyard.spec import ChannelSpec, JobSpec

FRAMEWORK_ENV_NAME = envphase.FRAMEWORK_ENV_NAME
__all__ = ["ControlPlane", "JobReader", "describe"]  # describe: the server's


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


class ControlPlane(JobReader):
    """Submits and runs jobs; reads them as its base, JobReader, does (control.reading),
    records validated."""

    # -- submission -----------------------------------------------------------------------
    def submit(self, spec: JobSpec, log=None, identity: dict[str, str] | None = None) -> JobRecord:
        """Validate, stage, record. On any error nothing is left but the refusal (a
        SIGTERM meanwhile too: it interrupts like Ctrl-C, and the reservation is undone).
        ``identity``: what the job's processes get to reach a service as themselves (a
        credential `shipyard server` minted for this job), beside the spec's environment."""
        with terminate_as_interrupt():
            return self._submit(spec, log, identity or {})

    def _submit(self, spec: JobSpec, log=None, identity: dict[str, str] | None = None) -> JobRecord:
        """A pipeline of four steps with one rollback: every refusal that needs nothing
        written comes first (``_checked``); then the name is reserved (``_reserve``);
        what follows is this submit's own, undone as a whole on any error or interrupt."""
        job_plan, sources = self._checked(spec)
        record = self._reserve(job_plan)
        staged = None
        try:
            staged = self._stage(job_plan)
            record = self._write_job(job_plan, record, staged, sources, identity or {})
        except BaseException:
            self._rollback(job_plan, staged)
            raise
        if log:
            self._say(job_plan, staged, log)
        return record

    def _checked(self, spec: JobSpec) -> tuple[JobPlan, dict[str, str]]:
        """The spec's plan with its output_path normalized, and each channel's source;
        refuses (nothing written) a bad spec, a backend that cannot run it, a missing
        channel or bucket, and a name already taken."""
        job_plan = build(spec, self.backend)  # every refusal of the spec itself
        backends.validate(self.backend, spec.instance_count, spec.instance_type, job_plan.runner)
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
        return job_plan.with_spec(spec), sources

    def _reserve(self, job_plan: JobPlan) -> JobRecord:
        """The name and the job's subnet, reserved atomically, and the job's directory:
        of concurrent submits of one name exactly one gets past here, the others leave
        with JobExistsError having touched nothing."""
        spec = job_plan.spec
        job_dir = self.home.job_dir(spec.job_name)
        record = self.store.create_job(
            spec,
            {},
            job_dir,
            self.backend,
            functools.partial(plan.choose_subnet, sandboxed=job_plan.sandbox.sandboxed),
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
        return record

    def _stage(self, job_plan: JobPlan) -> staging.StagedCode:
        """The code bundled and uploaded; staging shows its own progress (bundling and
        upload bars, pip's spinner)."""
        spec = job_plan.spec
        assert spec.output_path is not None  # normalized by _checked
        code_location = spec.code_location or spec.output_path
        staged = staging.stage(
            spec.code,
            spec.job_name,
            code_location,
            self.home.requirements_cache,
            local_dir=os.path.join(self.home.job_dir(spec.job_name), "source"),
            exclude=self._never_bundled(spec, code_location),
            # a framework environment installs requirements.txt in its own resolve
            requirements=job_plan.env_request is None,
        )
        legacy_mode.check_bundle(staged.bundle_path, staged.entry_point)
        return staged

    def _write_job(
        self,
        job_plan: JobPlan,
        record: JobRecord,
        staged: staging.StagedCode,
        sources: dict[str, str],
        identity: dict[str, str],
    ) -> JobRecord:
        """The job's files (agent.json readable by its owner only: it holds the job's
        secret) and the record's hyperparameters; the record as it then stands."""
        spec = job_plan.spec
        job_dir = self.home.job_dir(spec.job_name)
        encoded = plan.hyperparameters(job_plan, staged, self.home)
        assert record.subnet is not None  # chosen with the reservation
        job_plan = job_plan.with_subnet(record.subnet)
        config = plan.agent_config(job_plan, staged, encoded, self.home, sources, identity)
        os.makedirs(os.path.join(job_dir, "logs"))
        if job_plan.env_request is not None:
            envphase.write_request(job_dir, job_plan.env_request)
        elif job_plan.framework_env.resolution is not None:
            with open(os.path.join(job_dir, FRAMEWORK_ENV_NAME), "w") as fh:
                json.dump(job_plan.framework_env.describe(), fh)
        with open(os.path.join(job_dir, "job.json"), "w") as fh:
            fh.write(spec.model_dump_json(indent=1))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with open(os.open(os.path.join(job_dir, "agent.json"), flags, 0o600), "w") as fh:
            fh.write(config.to_json())
        if config.shared_dir:
            os.makedirs(os.path.join(config.shared_dir, "model"), exist_ok=True)
        self.store.update(spec.job_name, hyperparameters=encoded)
        return self.store.get(spec.job_name)

    def _rollback(self, job_plan: JobPlan, staged: staging.StagedCode | None) -> None:
        """Everything after the reservation is this submit's own: its directory, its
        staged code and the reserved name go."""
        name = job_plan.spec.job_name
        shutil.rmtree(self.home.job_dir(name), ignore_errors=True)
        if staged is not None:
            staging.discard(staged)
        self.store.delete_job(name)

    def _say(self, job_plan: JobPlan, staged: staging.StagedCode, log) -> None:
        """What the submitter is told: the instances, the framework environment, notes."""
        spec, framework_env, env_request = (
            job_plan.spec,
            job_plan.framework_env,
            job_plan.env_request,
        )
        log(job_plan.resources.describe())
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
        hidden = plan.checkpoint_note(spec, self.home)
        if hidden:
            log(hidden)

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
