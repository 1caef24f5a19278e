"""JobSpec: the one validated, serializable description of a training job.

Every entry point (the SDK, the CLI, later a REST API) produces a JobSpec; the control
plane stores it as JSON and everything downstream reads it. Validation here is about
the *shape* of the request (types, ranges, forms); checks against the filesystem
(does the entry point exist?) happen in control.staging, before anything is written.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar, Literal

from shipyard import distribution as dist_mod
from shipyard.errors import ValidationError
from shipyard.spec_model import (
    Field,
    Model,
    SpecValidationError,
    check_bool,
    check_int,
    check_literal,
    check_str,
    check_str_or_false,
    dict_of,
    list_of,
    model,
    optional,
)

InputMode = Literal["File", "FastFile", "Pipe"]
JOB_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


INPUT_MODE = check_literal("File", "FastFile", "Pipe")
OPTIONAL_STR = optional(check_str)


def _channel_name(value: str) -> str:
    if not re.match(r"^[A-Za-z0-9\.\-_]{1,64}$", value):
        raise ValueError(f"channel name {value!r} must be 1-64 letters, digits, '.', '-' or '_'")
    return value


class ChannelSpec(Model):
    """One input channel, mirroring sagemaker.inputs.TrainingInput."""

    name: str
    uri: str
    input_mode: InputMode | None
    distribution: Literal["FullyReplicated", "ShardedByS3Key"]
    compression: Literal["Gzip"] | None
    content_type: str | None
    record_wrapping: Literal["RecordIO"] | None
    s3_data_type: Literal["S3Prefix", "ManifestFile"]

    fields: ClassVar[dict[str, Field]] = {
        "name": Field(check_str, after=(_channel_name,)),
        "uri": Field(check_str),
        "input_mode": Field(optional(INPUT_MODE), None),
        "distribution": Field(
            check_literal("FullyReplicated", "ShardedByS3Key"), "FullyReplicated"
        ),
        "compression": Field(optional(check_literal("Gzip")), None),
        "content_type": Field(OPTIONAL_STR, None),
        "record_wrapping": Field(optional(check_literal("RecordIO")), None),
        "s3_data_type": Field(check_literal("S3Prefix", "ManifestFile"), "S3Prefix"),
    }


class CodeSpec(Model):
    """Where the user's code comes from (resolved by control.staging)."""

    entry_point: str
    source_dir: str | None
    dependencies: list[str]
    git_config: dict[str, str] | None

    fields: ClassVar[dict[str, Field]] = {
        "entry_point": Field(check_str),
        "source_dir": Field(OPTIONAL_STR, None),
        "dependencies": Field(list_of(check_str), factory=list),
        "git_config": Field(optional(dict_of(check_str)), None),
    }


def _compiles(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"metric regex {value!r} does not compile: {exc}") from exc
    return value


class MetricDefinition(Model):
    Name: str
    Regex: str

    fields: ClassVar[dict[str, Field]] = {
        "Name": Field(check_str),
        "Regex": Field(check_str, after=(_compiles,)),
    }


DEFAULT_VOLUME_GB = 30  # SageMaker's default VolumeSizeInGB
MIN_VOLUME_GB, MAX_VOLUME_GB = 1, 16384  # SageMaker's range


def check_volume_size(value: Any) -> int:
    """``value`` as a VolumeSizeInGB (a whole number in SageMaker's range), or ValueError
    saying what was wrong."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"VolumeSizeInGB must be a whole number of GB, got {value!r}")
    if not MIN_VOLUME_GB <= value <= MAX_VOLUME_GB:
        raise ValueError(
            f"VolumeSizeInGB must be between {MIN_VOLUME_GB} and {MAX_VOLUME_GB} GB "
            f"(SageMaker's range), got {value}"
        )
    return value


def host_names(instance_count: int) -> list[str]:
    """SageMaker's host names for a job of ``instance_count`` instances."""
    return [f"algo-{i}" for i in range(1, instance_count + 1)]


TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
# the instance's own tree, as its processes see it, and SageMaker's checkpoint directory
INSTANCE_TREE = "/opt/ml"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"


def in_instance_tree(path: str) -> bool:
    """``path`` (absolute, normalized) is a directory of the instance's own ``/opt/ml``."""
    return path.startswith(INSTANCE_TREE + "/")


def check_local_path(what: str, value: str, host_paths: bool) -> str:
    """A local path of a spec (CheckpointConfig.LocalPath, TensorBoardOutputConfig.LocalPath)
    is a path *inside* the instance, as on SageMaker (default ``/opt/ml/checkpoints``).
    Absolute and normalized, so what it names cannot be argued about; never the tree's top
    or its input (a sync would upload the job's data and configuration). Outside
    ``/opt/ml`` only where ``host_paths`` (the SDK and CLI, whose user may name a
    directory of this machine for the instances to share); a request to ``shipyard
    server`` never reaches the host's files. Returns it without a trailing slash."""
    problem = None
    parts = value.split("/") if isinstance(value, str) else []
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or "\n" in value:
        problem = "must be an absolute path"
    elif any(p in (".", "..") for p in parts):
        problem = "must be normalized (no '.' or '..' components)"
    elif value.rstrip("/") in ("", INSTANCE_TREE) or nested_in(
        value.rstrip("/"), INSTANCE_TREE + "/input"
    ):
        problem = "must be a directory of its own, not /, /opt/ml or under /opt/ml/input"
    elif not host_paths and not in_instance_tree(value):
        problem = (
            "must be inside the instance's tree (/opt/ml/..., SageMaker's default is "
            f"{CHECKPOINT_LOCAL_PATH}): it names a directory inside the training container, "
            "and a request never gets a directory of this machine bound into a job"
        )
    if problem:
        raise ValueError(f"{what} {value!r} {problem}")
    return value.rstrip("/")


def nested_in(path: str, top: str) -> bool:
    """``path`` is ``top`` or below it (both absolute and normalized)."""
    return path == top or path.startswith(top + "/")


class TensorBoardSpec(Model):
    """SageMaker's TensorBoardOutputConfig (S3OutputPath, LocalPath)."""

    s3_output_path: str
    local_path: str

    fields: ClassVar[dict[str, Field]] = {
        "s3_output_path": Field(check_str),
        "local_path": Field(check_str, TENSORBOARD_LOCAL_PATH),
    }

    def output_uri(self, job_name: str) -> str:
        """Where the files go: SageMaker's ``<S3OutputPath>/<job>/tensorboard-output``."""
        return f"{self.s3_output_path.rstrip('/')}/{job_name}/tensorboard-output"


def _job_name(value: str) -> str:
    if not JOB_NAME_PATTERN.match(value):
        raise ValueError(
            f"job name {value!r} must be 1-63 letters, digits or hyphens, starting "
            "with a letter or digit (SageMaker's rule)"
        )
    return value


def _count(value: int) -> int:
    if value < 1:
        raise ValueError(f"instance_count must be at least 1, got {value}")
    return value


def _max_run(value: int) -> int:
    if value < 1:
        raise ValueError(f"max_run must be a positive number of seconds, got {value}")
    return value


def _retries(value: int) -> int:
    if not 0 <= value <= 30:
        raise ValueError(f"max_retry_attempts must be between 0 and 30, got {value}")
    return value


def _hps(value: dict[str, Any]) -> dict[str, Any]:
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"hyperparameter names must be non-empty strings, got {key!r}")
        try:
            json.dumps(item, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"hyperparameter {key!r} = {item!r} cannot be JSON-encoded ({exc}); "
                "use numbers, strings, booleans, lists or dicts of those"
            ) from exc
    return value


def _env(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"environment variable name {key!r} is not valid")
    return value


class JobSpec(Model):
    """A training job as submitted. Serialized into the job store and the job dir."""

    job_name: str
    framework: Literal["tensorflow", "pytorch"] | None
    framework_version: str | None
    py_version: str | None
    code: CodeSpec
    hyperparameters: dict[str, Any]
    instance_count: int
    instance_type: str
    distribution: dict[str, Any]
    channels: list[ChannelSpec]
    input_mode: InputMode
    output_path: str | None
    code_location: str | None
    checkpoint_s3_uri: str | None
    checkpoint_local_path: str | None
    # TensorBoardOutputConfig: what the script writes under local_path is synced to
    # s3_output_path/<job>/tensorboard-output during the job and after it
    tensorboard: TensorBoardSpec | None
    environment: dict[str, str]
    max_run: int
    # ResourceConfig.VolumeSizeInGB: each instance's /opt/ml is a disk of this size where
    # the machine can make one (shipyard.sandbox.disk)
    volume_size_gb: int
    max_retry_attempts: int
    metric_definitions: list[MetricDefinition]
    tags: list[dict[str, str]]
    model_dir: str | Literal[False] | None
    role: str | None
    container_log_level: int
    # No outbound traffic from the instances (SageMaker's EnableNetworkIsolation); only
    # enforced where instances run in sandboxes (shipyard.sandbox).
    enable_network_isolation: bool
    backend: Literal["local"]
    # Whether the spec may name directories of this machine (a checkpoint_local_path
    # outside /opt/ml, host paths in its hyperparameters and environment bound into the
    # instances): True for the SDK and CLI, whose user owns those paths; False for a job
    # created through `shipyard server`'s API, whose requests never reach the host's files.
    host_paths: bool

    title: ClassVar[str] = "training job"
    fields: ClassVar[dict[str, Field]] = {
        "job_name": Field(check_str, after=(_job_name,)),
        "framework": Field(optional(check_literal("tensorflow", "pytorch")), None),
        "framework_version": Field(OPTIONAL_STR, None),
        "py_version": Field(OPTIONAL_STR, None),
        "code": Field(model(CodeSpec)),
        "hyperparameters": Field(dict_of(None), factory=dict, after=(_hps,)),
        "instance_count": Field(check_int, 1, after=(_count,)),
        "instance_type": Field(check_str, "local"),
        "distribution": Field(dict_of(None), factory=dict),
        "channels": Field(list_of(model(ChannelSpec)), factory=list),
        "input_mode": Field(INPUT_MODE, "File"),
        "output_path": Field(OPTIONAL_STR, None),
        "code_location": Field(OPTIONAL_STR, None),
        "checkpoint_s3_uri": Field(OPTIONAL_STR, None),
        "checkpoint_local_path": Field(OPTIONAL_STR, None),
        "tensorboard": Field(optional(model(TensorBoardSpec)), None),
        "environment": Field(dict_of(check_str), factory=dict, after=(_env,)),
        "max_run": Field(check_int, 24 * 60 * 60, after=(_max_run,)),
        "volume_size_gb": Field(check_int, DEFAULT_VOLUME_GB, before=(check_volume_size,)),
        "max_retry_attempts": Field(check_int, 0, after=(_retries,)),
        "metric_definitions": Field(list_of(model(MetricDefinition)), factory=list),
        "tags": Field(list_of(dict_of(check_str)), factory=list),
        "model_dir": Field(optional(check_str_or_false), None),
        "role": Field(OPTIONAL_STR, None),
        "container_log_level": Field(check_int, 20),
        "enable_network_isolation": Field(check_bool, False),
        "backend": Field(check_literal("local"), "local"),
        "host_paths": Field(check_bool, True),
    }
    model_validators: ClassVar[tuple[str, ...]] = (
        "_checkpoint_local_path",
        "_channels_unique",
    )

    def _checkpoint_local_path(self) -> JobSpec:
        if self.checkpoint_local_path is not None:
            self.checkpoint_local_path = check_local_path(
                "checkpoint_local_path (CheckpointConfig.LocalPath)",
                self.checkpoint_local_path,
                self.host_paths,
            )
        return self

    def _channels_unique(self) -> JobSpec:
        names = [c.name for c in self.channels]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"channel name(s) {dupes} given more than once")
        dist_mod.parse(self.dist.to_sagemaker())  # the stored form is re-validated
        return self

    @property
    def dist(self) -> dist_mod.Distribution:
        return dist_mod.Distribution.from_dict(self.distribution)

    def channel_mode(self, channel: ChannelSpec) -> str:
        """The channel's input mode: its own, else the job's (TrainingInput overrides)."""
        return channel.input_mode or self.input_mode

    @property
    def hosts(self) -> list[str]:
        return host_names(self.instance_count)


def validated(**fields: Any) -> JobSpec:
    """Build a JobSpec, its problems (in pydantic's words and order, as before issue 40)
    one shipyard ValidationError."""
    try:
        return JobSpec(**fields)
    except SpecValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ())) or "job"
            msg = err.get("msg", "invalid")
            problems.append(f"{where}: {msg.removeprefix('Value error, ')}")
        raise ValidationError("invalid training job: " + "; ".join(problems)) from None


def json_encode_hyperparameters(hps: dict[str, Any]) -> dict[str, str]:
    """hyperparameters.json values: each one ``json.dumps``-ed, as the SageMaker SDK does."""
    out = {}
    for key, value in hps.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValidationError(f"hyperparameter {key!r} = {value!r} is not finite")
        out[str(key)] = json.dumps(value)
    return out
