"""CreateTrainingJob & co.: SageMaker's training API over shipyard's control plane.

A request becomes a JobSpec (``spec_from_request``): the image names the framework,
``sagemaker_program`` / ``sagemaker_submit_directory`` the code (the SDK's s3://
``sourcedir.tar.gz``, unpacked into a staging directory the control plane then bundles
as it does any source_dir), the ``sagemaker_*`` distribution keys the distribution,
the rest of the hyperparameters arrive JSON-decoded as the SDK encoded them. The
control plane validates, stages and records it -- the same record ``shipyard jobs``
lists -- and a detached supervisor runs it. Refusals leave nothing behind.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import tarfile
import tempfile
from typing import Any

from shipyard import distribution as dist_mod
from shipyard import instance_types
from shipyard.control.client import ControlPlane, describe
from shipyard.debugger import tensorboard_spec
from shipyard.errors import JobExistsError, JobNotFoundError, ShipyardError
from shipyard.server import images
from shipyard.server.errors import ApiError, in_use, limit_exceeded, validation
from shipyard.server.identity import ACCOUNT
from shipyard.server.job_creds import grants_for, job_environment
from shipyard.server.job_keys import KeyTable
from shipyard.server.objects import ObjectStore
from shipyard.server.records import Records
from shipyard.spec import DEFAULT_VOLUME_GB, TENSORBOARD_LOCAL_PATH, check_local_path, validated

log = logging.getLogger("shipyard.server")
# instances of unfinished jobs at once (SageMaker's per-account quota; one machine's sense)
INSTANCE_QUOTA = 32
# hyperparameters the SDK writes for the platform, not for the script
_PLATFORM_KEYS = (
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_container_log_level",
    "sagemaker_job_name",
    "sagemaker_region",
    "sagemaker_estimator_class_name",
    "sagemaker_estimator_module",
    "sagemaker_instance_type",
)
_DIST_FLAGS = {
    "sagemaker_parameter_server_enabled": "parameter_server",
    "sagemaker_mpi_enabled": "mpi",
    "sagemaker_torch_distributed_enabled": "torch_distributed",
    "sagemaker_pytorch_ddp_enabled": "pytorchddp",
    "sagemaker_multi_worker_mirrored_strategy_enabled": "multi_worker_mirrored_strategy",
    "sagemaker_distributed_dataparallel_enabled": "smdistributed",
}


def arn(region: str, kind: str, name: str) -> str:
    return f"arn:aws:sagemaker:{region}:{ACCOUNT}:{kind}/{name.lower()}"


def decode_hyperparameters(raw: dict[str, Any]) -> dict[str, Any]:
    """The SDK ``json.dumps`` each value; a value that is not JSON stays a string."""
    out = {}
    for key, value in raw.items():
        if not isinstance(value, str):
            raise validation(f"hyperparameter {key!r} must be a string, got {value!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def distribution_from(hps: dict[str, Any]) -> dict[str, Any]:
    """The ``distribution=`` dict the SDK's ``sagemaker_*`` keys encode (inverse of
    shipyard.distribution.reserved_hyperparameters)."""
    kinds = [kind for flag, kind in _DIST_FLAGS.items() if hps.get(flag) not in (None, False)]
    if len(kinds) > 1:
        raise validation(f"hyperparameters enable more than one distribution: {kinds}")
    if not kinds:
        return {}
    kind = kinds[0]
    for flag in _DIST_FLAGS:
        value = hps.get(flag)
        if value is not None and value is not True and flag != "sagemaker_mpi_enabled":
            if not isinstance(value, bool):
                raise validation(f"hyperparameter {flag} must be true or false, got {value!r}")
    if kind == "mpi":
        if hps["sagemaker_mpi_enabled"] is not True:
            raise validation(
                f"hyperparameter sagemaker_mpi_enabled must be true or false, got "
                f"{hps['sagemaker_mpi_enabled']!r}"
            )
        opts: dict[str, Any] = {"enabled": True}
        if "sagemaker_mpi_num_of_processes_per_host" in hps:
            opts["processes_per_host"] = hps["sagemaker_mpi_num_of_processes_per_host"]
        if hps.get("sagemaker_mpi_custom_mpi_options"):
            opts["custom_mpi_options"] = hps["sagemaker_mpi_custom_mpi_options"]
        return {"mpi": opts}
    if kind == "smdistributed":
        opts = {"enabled": True}
        custom = hps.get("sagemaker_distributed_dataparallel_custom_mpi_options")
        if custom:
            opts["custom_mpi_options"] = custom
        return {"smdistributed": {"dataparallel": opts}}
    return {kind: {"enabled": True}}


class TrainingApi:
    def __init__(
        self,
        control: ControlPlane,
        objects: ObjectStore,
        records: Records,
        staging: str,
        keys: KeyTable | None = None,
        url: str | None = None,
    ) -> None:
        self.control = control
        self.objects = objects
        self.records = records
        self.staging = staging
        self.keys = keys  # mints each job its own credential (job_keys); None: none given
        self.url = url  # where a job reaches this server

    # -- create ---------------------------------------------------------------------------
    def create_training_job(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("TrainingJobName") or "")
        if self.control.store.exists(name):
            raise in_use(
                f"Training job names must be unique within an AWS account and region, and a "
                f"training job with this name already exists ({arn(region, 'training-job', name)})"
            )
        self._check_quota(req)
        image = (req.get("AlgorithmSpecification") or {}).get("TrainingImage", "")
        framework, version = images.parse(image, "training")
        work = tempfile.mkdtemp(prefix=f"{name[:40]}-", dir=self.staging)
        try:
            # the image's version is the job's: it runs in a framework environment of it
            spec = self.spec_from_request(req, framework, work, version, images.py_version(image))
            note = _gpu_note(spec.instance_type, spec.dist.kind)
            identity = self._identity(spec, region)
            try:
                self.control.submit(spec, log=log.info, identity=identity)
            except BaseException:
                if identity and self.keys is not None:
                    self.keys.discard(name)  # refused: no key of it is left
                raise
            self.records.put("training-job", name, {"Request": req})
        except JobExistsError as exc:
            raise in_use(str(exc)) from None
        except ApiError:  # already in the protocol's words (an ApiError is a ShipyardError too)
            raise
        except ShipyardError as exc:
            raise validation(str(exc)) from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if note:
            log.warning("%s: %s", name, note)
        self.control.start(name)
        return {"TrainingJobArn": arn(region, "training-job", name)}

    def _identity(self, spec: Any, region: str) -> dict[str, str]:
        """The environment that lets the job reach this server as itself: a credential
        minted for it alone (job_keys, job_creds). None with EnableNetworkIsolation: as on
        SageMaker, an isolated container is given no credentials."""
        if self.keys is None or not self.url or spec.enable_network_isolation:
            return {}
        read, write = grants_for(spec)
        grant = self.keys.mint(spec.job_name, read, write)
        return job_environment(grant, self.url, region)

    def _check_quota(self, req: dict[str, Any]) -> None:
        """SageMaker's per-account instance quota, here: instances of unfinished jobs."""
        resources = req.get("ResourceConfig") or {}
        try:
            wanted = int(resources.get("InstanceCount") or 1)
        except (TypeError, ValueError):
            raise validation("ResourceConfig.InstanceCount must be an integer") from None
        running = sum(_instance_count(r.spec) for r in self.control.list(1000) if not r.terminal)
        if running + wanted > INSTANCE_QUOTA:
            raise limit_exceeded(
                f"The account-level service limit 'training job instances' is {INSTANCE_QUOTA} "
                f"Instances, with current utilization of {running} Instances and a request "
                f"delta of {wanted} Instances. Wait for running jobs to end or stop some."
            )

    def spec_from_request(
        self,
        req: dict[str, Any],
        framework: str,
        work: str,
        framework_version: str | None = None,
        py_version: str | None = None,
    ):
        name = str(req.get("TrainingJobName") or "")
        algo = req.get("AlgorithmSpecification") or {}
        hps = decode_hyperparameters(req.get("HyperParameters") or {})
        program = hps.get("sagemaker_program")
        submit = hps.get("sagemaker_submit_directory")
        if not program or not isinstance(program, str):
            raise validation(
                "HyperParameters must name the script in sagemaker_program (the SDK's "
                "Framework estimators write it from entry_point)"
            )
        if submit is not None and not (isinstance(submit, str) and submit.startswith("s3://")):
            raise validation(
                f"HyperParameters.sagemaker_submit_directory {submit!r} must be an s3:// "
                "location on this server's S3 (the SDK uploads sourcedir.tar.gz there): a "
                "request never names a directory or file of the server's machine (local "
                "code runs with instance_type='local', or the shipyard SDK and CLI)"
            )
        source_dir = self._unpack_code(submit, work) if submit else None
        try:
            distribution = dist_mod.parse(distribution_from(hps)).to_dict()
        except ShipyardError as exc:
            raise validation(f"invalid distribution hyperparameters: {exc}") from None
        output = req.get("OutputDataConfig") or {}
        resources = req.get("ResourceConfig") or {}
        instance_type = str(resources.get("InstanceType") or "")
        try:
            instance_types.nominal(instance_type)
        except ShipyardError as exc:
            raise validation(
                f"1 validation error detected: Value {instance_type!r} at "
                f"'resourceConfig.instanceType' failed to satisfy constraint: {exc}"
            ) from None
        model_dir = hps.get("model_dir")
        user_hps = {
            k: v
            for k, v in hps.items()
            if k not in _PLATFORM_KEYS and k not in _DIST_FLAGS and not k.startswith("sagemaker_")
        }
        if isinstance(model_dir, str) and model_dir.startswith("s3://"):
            # the TF estimator's default model_dir (s3://<output>/<job>/model): shipyard's
            # TensorFlow jobs get a directory every instance shares instead
            user_hps.pop("model_dir")
        channels = []
        for ch in req.get("InputDataConfig") or []:
            source = (ch.get("DataSource") or {}).get("S3DataSource") or {}
            if not source:
                raise validation(
                    f"channel {ch.get('ChannelName')!r}: only S3DataSource is supported"
                )
            channels.append(
                {
                    "name": ch.get("ChannelName"),
                    "uri": source.get("S3Uri"),
                    "input_mode": ch.get("InputMode"),
                    "distribution": source.get("S3DataDistributionType", "FullyReplicated"),
                    "compression": None
                    if ch.get("CompressionType") in (None, "None")
                    else ch["CompressionType"],
                    "content_type": ch.get("ContentType"),
                    "record_wrapping": None
                    if ch.get("RecordWrapperType") in (None, "None")
                    else ch["RecordWrapperType"],
                    "s3_data_type": source.get("S3DataType", "S3Prefix"),
                }
            )
        checkpoint = req.get("CheckpointConfig") or {}
        stopping = req.get("StoppingCondition") or {}
        _s3_only("InputDataConfig.S3Uri", [ch["uri"] for ch in channels])
        _s3_only("OutputDataConfig.S3OutputPath", [output.get("S3OutputPath")])
        _s3_only("CheckpointConfig.S3Uri", [checkpoint.get("S3Uri")])
        return validated(
            job_name=name,
            framework=framework,
            framework_version=framework_version,
            py_version=py_version,
            code={"entry_point": program, "source_dir": source_dir},
            hyperparameters=user_hps,
            instance_count=int(resources.get("InstanceCount") or 1),
            instance_type=instance_type,
            distribution=distribution,
            channels=channels,
            input_mode=algo.get("TrainingInputMode") or "File",
            output_path=output.get("S3OutputPath"),
            checkpoint_s3_uri=checkpoint.get("S3Uri"),
            checkpoint_local_path=checkpoint.get("LocalPath"),
            tensorboard=self._tensorboard(req.get("TensorBoardOutputConfig")),
            environment=req.get("Environment") or {},
            max_run=int(stopping.get("MaxRuntimeInSeconds") or 24 * 3600),
            # checked by the spec (1..16384, SageMaker's range); absent: SageMaker's 30
            volume_size_gb=resources.get("VolumeSizeInGB", DEFAULT_VOLUME_GB),
            max_retry_attempts=int(
                (req.get("RetryStrategy") or {}).get("MaximumRetryAttempts") or 0
            ),
            metric_definitions=algo.get("MetricDefinitions") or [],
            tags=req.get("Tags") or [],
            role=req.get("RoleArn"),
            container_log_level=int(hps.get("sagemaker_container_log_level") or 20),
            host_paths=False,  # a request never reaches this machine's files
        )

    @staticmethod
    def _tensorboard(config: Any) -> dict[str, str] | None:
        """TensorBoardOutputConfig -> the JobSpec's tensorboard (synced to
        ``<S3OutputPath>/<job>/tensorboard-output`` while the job runs and after it)."""
        if config is None:
            return None
        if not isinstance(config, dict) or not config.get("S3OutputPath"):
            raise validation(
                "TensorBoardOutputConfig needs S3OutputPath (an s3:// location on this "
                "server's S3), and optionally LocalPath"
            )
        _s3_only("TensorBoardOutputConfig.S3OutputPath", [config.get("S3OutputPath")])
        local = config.get("LocalPath")
        if local is not None:
            try:
                check_local_path("TensorBoardOutputConfig.LocalPath", local, host_paths=False)
            except ValueError as exc:
                raise validation(str(exc)) from None
        return tensorboard_spec(config)

    def _unpack_code(self, submit: Any, work: str) -> str:
        """The SDK's sourcedir.tar.gz (s3:// on this server) unpacked."""
        if not isinstance(submit, str):
            raise validation(f"sagemaker_submit_directory {submit!r} must be a string")
        dest = os.path.join(work, "source")
        bucket, _, key = submit[len("s3://") :].partition("/")
        try:
            obj = self.objects.get(bucket, key)
        except ApiError:
            raise validation(
                f"sagemaker_submit_directory {submit} does not exist on this server's S3"
            ) from None
        archive = obj.file
        try:
            with tarfile.open(archive, "r:*") as tar:
                tar.extractall(dest, filter=_private_member)
        except (OSError, tarfile.TarError) as exc:
            raise validation(
                f"sagemaker_submit_directory {submit}: not a readable tar.gz ({exc})"
            ) from None
        return dest

    # -- read / stop ----------------------------------------------------------------------
    def _record(self, name: str):
        try:
            return self.control.get(name)
        except JobNotFoundError:
            raise validation("Requested resource not found.") from None

    def describe_training_job(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("TrainingJobName") or "")
        out = describe(self.control, self._record(name))
        out.pop("Shipyard", None)
        out["TrainingJobArn"] = arn(region, "training-job", name)
        extra = self.records.get("training-job", name)
        if extra:  # the request's own fields, as SageMaker echoes them (attach() reads them)
            request = extra["Request"]
            for key in _ECHOED:
                if key in request:
                    out[key] = request[key]
        out["OutputDataConfig"].setdefault("KmsKeyId", "")
        tensorboard = (extra or {}).get("Request", {}).get("TensorBoardOutputConfig")
        if tensorboard:  # SageMaker echoes it with LocalPath's default filled in
            out["TensorBoardOutputConfig"] = {"LocalPath": TENSORBOARD_LOCAL_PATH, **tensorboard}
        return {k: v for k, v in out.items() if v is not None}

    def stop_training_job(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        name = str(req.get("TrainingJobName") or "")
        record = self._record(name)
        if record.terminal:
            raise validation(
                f"The request was rejected because the training job is in status {record.status}."
            )
        self.control.stop(name, wait=False)
        return {}

    def list_training_jobs(self, req: dict[str, Any], region: str) -> dict[str, Any]:
        contains = req.get("NameContains")
        status = req.get("StatusEquals")
        limit = int(req.get("MaxResults") or 100)
        token = req.get("NextToken") or "0"
        if not token.isdigit():
            raise validation(f"NextToken {token!r} is not one this server gave out")
        start = int(token)
        # SageMaker's time filters: After is exclusive, Before exclusive, as the SDK's
        # helpers (and the notebooks) use them to find recent jobs
        created_after = _epoch(req, "CreationTimeAfter")
        created_before = _epoch(req, "CreationTimeBefore")
        modified_after = _epoch(req, "LastModifiedTimeAfter")
        modified_before = _epoch(req, "LastModifiedTimeBefore")
        summaries: list[dict[str, Any]] = []
        for rec in self.control.list(limit=10000):
            if contains and contains not in rec.name:
                continue
            if status and rec.status != status:
                continue
            if not _within(rec.created_at, created_after, created_before):
                continue
            if not _within(rec.modified_at, modified_after, modified_before):
                continue
            summaries.append(
                {
                    "TrainingJobName": rec.name,
                    "TrainingJobArn": arn(region, "training-job", rec.name),
                    "CreationTime": rec.created_at,
                    "TrainingEndTime": rec.end_time,
                    "LastModifiedTime": rec.modified_at,
                    "TrainingJobStatus": rec.status,
                }
            )
        by = {"Name": "TrainingJobName", "Status": "TrainingJobStatus"}.get(
            req.get("SortBy") or "CreationTime", "CreationTime"
        )
        # newest first unless asked otherwise (the store lists by creation, newest first)
        summaries.sort(
            key=lambda s: s[by],
            reverse=req.get("SortOrder") != "Ascending",
        )
        page = summaries[start : start + limit]
        out: dict[str, Any] = {
            "TrainingJobSummaries": [{k: v for k, v in s.items() if v is not None} for s in page]
        }
        if start + limit < len(summaries):
            out["NextToken"] = str(start + limit)
        return out


def _s3_only(member: str, values: list[Any]) -> None:
    """A location from a request is on S3: a file:// or bare path would name a file of
    the server's machine, which a request never reaches."""
    for value in values:
        if value is not None and not (isinstance(value, str) and value.startswith("s3://")):
            raise validation(
                f"{member} {value!r} must be an s3:// location on this server's S3: a "
                "request never names a directory or file of the server's machine"
            )


def _epoch(req: dict[str, Any], member: str) -> float | None:
    """A timestamp member as epoch seconds: boto3 sends a number, a hand-written request
    may send ISO 8601 (both are AWS's JSON timestamp forms)."""
    value = req.get(member)
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise validation(
            f"{member} {value!r} is not a timestamp: send epoch seconds or ISO 8601"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def _within(when: float | None, after: float | None, before: float | None) -> bool:
    if when is None:
        return after is None and before is None
    return (after is None or when > after) and (before is None or when < before)


_ECHOED = (
    "AlgorithmSpecification",
    "HyperParameters",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "StoppingCondition",
    "CheckpointConfig",
    "VpcConfig",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "DebugHookConfig",
    "ProfilerConfig",
    "Environment",
    "RetryStrategy",
)


def _instance_count(spec: Any) -> int:
    """A stored spec's instance count (a dict today, a typed JobSpec after issue 14)."""
    if isinstance(spec, dict):
        return int(spec.get("instance_count", 1))
    return int(getattr(spec, "instance_count", 1))


_noted: set[tuple[str, str | None]] = set()


def _gpu_note(instance_type: str, kind: str | None) -> str | None:
    """torch_distributed on a GPU instance type on a machine without GPUs runs on CPU
    (said once per instance type and distribution)."""
    try:
        res = instance_types.resolve(instance_type)
    except ShipyardError:
        return None
    if res.nominal_gpus and not res.num_gpus and (instance_type, kind) not in _noted:
        _noted.add((instance_type, kind))
        what = f"{kind} " if kind else ""
        return (
            f"{instance_type} has {res.nominal_gpus} GPU(s) on SageMaker; this machine has none, "
            f"so the {what}job runs on CPU" + (" with gloo" if kind in _TORCH_KINDS else "")
        )
    return None


_TORCH_KINDS = ("torch_distributed", "pytorchddp", "smdistributed.dataparallel")


def _private_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter, and the user's code kept the user's alone: the archive's
    group/other bits dropped (the modes travel with the code into every instance's tree)."""
    member = tarfile.data_filter(member, dest)
    if member.mode is None:
        return member
    return member.replace(mode=member.mode & 0o700, deep=False)
