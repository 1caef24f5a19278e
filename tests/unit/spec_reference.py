"""The pydantic models of shipyard.spec as they were before issue 40: the reference
tests/unit/test_spec_parity.py holds the plain models to (same objects, same JSON bytes,
same error messages). Not used by shipyard itself."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shipyard import distribution as dist_mod
from shipyard.errors import ValidationError
from shipyard.spec import (
    DEFAULT_VOLUME_GB,
    JOB_NAME_PATTERN,
    TENSORBOARD_LOCAL_PATH,
    check_local_path,
    check_volume_size,
)

InputMode = Literal["File", "FastFile", "Pipe"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ChannelSpec(_Model):
    """One input channel, mirroring sagemaker.inputs.TrainingInput."""

    name: str
    uri: str
    input_mode: InputMode | None = None
    distribution: Literal["FullyReplicated", "ShardedByS3Key"] = "FullyReplicated"
    compression: Literal["Gzip"] | None = None
    content_type: str | None = None
    record_wrapping: Literal["RecordIO"] | None = None
    s3_data_type: Literal["S3Prefix", "ManifestFile"] = "S3Prefix"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9\.\-_]{1,64}$", value):
            raise ValueError(
                f"channel name {value!r} must be 1-64 letters, digits, '.', '-' or '_'"
            )
        return value


class CodeSpec(_Model):
    """Where the user's code comes from (resolved by control.staging)."""

    entry_point: str
    source_dir: str | None = None
    dependencies: list[str] = Field(default_factory=list)
    git_config: dict[str, str] | None = None


class MetricDefinition(_Model):
    Name: str
    Regex: str

    @field_validator("Regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"metric regex {value!r} does not compile: {exc}") from exc
        return value


class TensorBoardSpec(_Model):
    """SageMaker's TensorBoardOutputConfig (S3OutputPath, LocalPath)."""

    s3_output_path: str
    local_path: str = TENSORBOARD_LOCAL_PATH

    def output_uri(self, job_name: str) -> str:
        """Where the files go: SageMaker's ``<S3OutputPath>/<job>/tensorboard-output``."""
        return f"{self.s3_output_path.rstrip('/')}/{job_name}/tensorboard-output"


class JobSpec(_Model):
    """A training job as submitted. Serialized into the job store and the job dir."""

    job_name: str
    framework: Literal["tensorflow", "pytorch"] | None = None
    framework_version: str | None = None
    py_version: str | None = None
    code: CodeSpec
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    instance_count: int = 1
    instance_type: str = "local"
    distribution: dict[str, Any] = Field(default_factory=dict)
    channels: list[ChannelSpec] = Field(default_factory=list)
    input_mode: InputMode = "File"
    output_path: str | None = None
    code_location: str | None = None
    checkpoint_s3_uri: str | None = None
    checkpoint_local_path: str | None = None
    # TensorBoardOutputConfig: what the script writes under local_path is synced to
    # s3_output_path/<job>/tensorboard-output during the job and after it
    tensorboard: TensorBoardSpec | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    max_run: int = 24 * 60 * 60
    # ResourceConfig.VolumeSizeInGB: each instance's /opt/ml is a disk of this size where
    # the machine can make one (shipyard.sandbox.disk)
    volume_size_gb: int = DEFAULT_VOLUME_GB
    max_retry_attempts: int = 0
    metric_definitions: list[MetricDefinition] = Field(default_factory=list)
    tags: list[dict[str, str]] = Field(default_factory=list)
    model_dir: str | Literal[False] | None = None
    role: str | None = None
    container_log_level: int = 20
    # No outbound traffic from the instances (SageMaker's EnableNetworkIsolation); only
    # enforced where instances run in sandboxes (shipyard.sandbox).
    enable_network_isolation: bool = False
    backend: Literal["local"] = "local"
    # Whether the spec may name directories of this machine (a checkpoint_local_path
    # outside /opt/ml, host paths in its hyperparameters and environment bound into the
    # instances): True for the SDK and CLI, whose user owns those paths; False for a job
    # created through `shipyard server`'s API, whose requests never reach the host's files.
    host_paths: bool = True

    @field_validator("job_name")
    @classmethod
    def _job_name(cls, value: str) -> str:
        if not JOB_NAME_PATTERN.match(value):
            raise ValueError(
                f"job name {value!r} must be 1-63 letters, digits or hyphens, starting "
                "with a letter or digit (SageMaker's rule)"
            )
        return value

    @field_validator("instance_count")
    @classmethod
    def _count(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"instance_count must be at least 1, got {value}")
        return value

    @field_validator("max_run")
    @classmethod
    def _max_run(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"max_run must be a positive number of seconds, got {value}")
        return value

    @field_validator("volume_size_gb", mode="before")
    @classmethod
    def _volume(cls, value: Any) -> int:
        return check_volume_size(value)

    @field_validator("max_retry_attempts")
    @classmethod
    def _retries(cls, value: int) -> int:
        if not 0 <= value <= 30:
            raise ValueError(f"max_retry_attempts must be between 0 and 30, got {value}")
        return value

    @field_validator("hyperparameters")
    @classmethod
    def _hps(cls, value: dict[str, Any]) -> dict[str, Any]:
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

    @field_validator("environment")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"environment variable name {key!r} is not valid")
        return value

    @model_validator(mode="after")
    def _checkpoint_local_path(self) -> JobSpec:
        if self.checkpoint_local_path is not None:
            self.checkpoint_local_path = check_local_path(
                "checkpoint_local_path (CheckpointConfig.LocalPath)",
                self.checkpoint_local_path,
                self.host_paths,
            )
        return self

    @model_validator(mode="after")
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


def validated(**fields: Any) -> JobSpec:
    """Build a JobSpec, turning pydantic's report into a shipyard ValidationError."""
    from pydantic import ValidationError as PydanticError

    try:
        return JobSpec(**fields)
    except PydanticError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ())) or "job"
            msg = err.get("msg", "invalid")
            problems.append(f"{where}: {msg.removeprefix('Value error, ')}")
        raise ValidationError("invalid training job: " + "; ".join(problems)) from None


from pydantic import ValidationError as PydanticValidationError  # noqa: E402

__all__ = ["PydanticValidationError"]
