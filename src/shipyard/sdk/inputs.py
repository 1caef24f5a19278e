"""TrainingInput: one channel's source and options (sagemaker.inputs.TrainingInput).

``s3_data`` is an s3:// URI (any S3 API: see shipyard.storage), a file:// URI or a local
path; ``input_mode`` overrides the estimator's for this channel. AugmentedManifestFile,
shuffle_config and attribute_names are not supported.
"""

from __future__ import annotations

from typing import Any

from shipyard.errors import ValidationError
from shipyard.spec import ChannelSpec


def _check(name: str, value: Any, allowed: tuple) -> None:
    """SageMaker's values, refused at construction with the list of what is accepted."""
    if value not in allowed:
        shown = ", ".join(repr(a) for a in allowed if a is not None)
        raise ValidationError(
            f"TrainingInput({name}={value!r}) is not valid; use one of "
            f"{shown}" + (" or None" if None in allowed else "")
        )


class TrainingInput:
    """One channel's data and how it reaches the instances
    (``sagemaker.inputs.TrainingInput``): ``fit({'train': TrainingInput(...)})``. A value
    SageMaker does not accept is refused here, with the ones it does."""

    def __init__(
        self,
        s3_data: str,
        distribution: str | None = None,
        compression: str | None = None,
        content_type: str | None = None,
        record_wrapping: str | None = None,
        s3_data_type: str = "S3Prefix",
        instance_groups: Any = None,
        input_mode: str | None = None,
        attribute_names: Any = None,
        target_attribute_name: Any = None,
        shuffle_config: Any = None,
        **_unused: Any,
    ) -> None:
        """Describe a channel.

        Args:
            s3_data: The data: an ``s3://`` URI (any S3 API), a ``file://`` URI or a local
                path, naming a prefix, a directory or a file. Required.
            distribution: ``'FullyReplicated'`` (default: every instance gets all of it) or
                ``'ShardedByS3Key'`` (each instance a share of the files).
            compression: ``'Gzip'`` for gzipped input in Pipe mode; None otherwise.
            content_type: The channel's MIME type, passed to the script in
                ``inputdataconfig.json``.
            record_wrapping: ``'RecordIO'`` to wrap each record in Pipe mode.
            s3_data_type: ``'S3Prefix'`` (default) or ``'ManifestFile'`` (a JSON list of
                keys under a prefix).
            instance_groups: Heterogeneous clusters on SageMaker; refused (one group).
            input_mode: ``'File'``, ``'FastFile'`` or ``'Pipe'`` for this channel; default
                the estimator's.
            attribute_names: Augmented manifests; refused.
            target_attribute_name: Augmented manifests; refused.
            shuffle_config: Shuffling on SageMaker; refused.
        """
        _check("input_mode", input_mode, (None, "File", "FastFile", "Pipe"))
        _check("distribution", distribution, (None, "FullyReplicated", "ShardedByS3Key"))
        _check("compression", compression, (None, "Gzip"))
        _check("record_wrapping", record_wrapping, (None, "RecordIO"))
        _check("s3_data_type", s3_data_type, ("S3Prefix", "ManifestFile"))
        if not isinstance(s3_data, str) or not s3_data:
            raise ValidationError(
                f"TrainingInput(s3_data={s3_data!r}): give an s3:// URI, a "
                "file:// URI or a local path"
            )
        if attribute_names or target_attribute_name or shuffle_config:
            raise ValidationError(
                "TrainingInput: attribute_names, target_attribute_name and "
                "shuffle_config (augmented manifests, shuffling) are not "
                "supported by shipyard; leave them out"
            )
        if instance_groups:
            raise ValueError(
                "TrainingInput(instance_groups=...) is not supported: shipyard "
                "runs one homogeneous group of instances"
            )
        self.s3_data = s3_data
        self.distribution = distribution or "FullyReplicated"
        self.compression = compression
        self.content_type = content_type
        self.record_wrapping = record_wrapping
        self.s3_data_type = s3_data_type
        self.input_mode = input_mode
        # The SageMaker SDK exposes the request dict as .config; keep a compatible view.
        self.config: dict[str, Any] = {
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": s3_data_type,
                    "S3Uri": s3_data,
                    "S3DataDistributionType": self.distribution,
                }
            },
        }
        if compression:
            self.config["CompressionType"] = compression
        if content_type:
            self.config["ContentType"] = content_type
        if record_wrapping:
            self.config["RecordWrapperType"] = record_wrapping
        if input_mode:
            self.config["InputMode"] = input_mode

    def to_channel(self, name: str) -> dict[str, Any]:
        """This input as the channel ``name`` of a JobSpec (what ``fit`` builds).

        Args:
            name: The channel's name (``train``, ...): ``SM_CHANNEL_<NAME>``.
        """
        return dict(
            name=name,
            uri=self.s3_data,
            input_mode=self.input_mode,
            distribution=self.distribution,
            compression=self.compression,
            content_type=self.content_type,
            record_wrapping=self.record_wrapping,
            s3_data_type=self.s3_data_type,
        )

    def __repr__(self) -> str:
        return f"TrainingInput({self.s3_data!r}, input_mode={self.input_mode!r})"


def channels_from_inputs(inputs: Any) -> list[dict[str, Any]]:
    """fit(inputs): str | TrainingInput | {channel: str | TrainingInput} -> channel dicts.

    A bare string or a single TrainingInput is the channel ``training`` (SageMaker's rule).
    """
    if inputs is None:
        return []
    if isinstance(inputs, (str, TrainingInput)):
        inputs = {"training": inputs}
    if not isinstance(inputs, dict):
        raise ValueError(
            f"inputs must be a str, a TrainingInput or a dict of channel name -> str or "
            f"TrainingInput; got {type(inputs).__name__}"
        )
    out = []
    for name, value in inputs.items():
        if isinstance(value, str):
            out.append(dict(name=name, uri=value))
        elif isinstance(value, TrainingInput):
            out.append(value.to_channel(name))
        else:
            raise ValueError(
                f"channel {name!r}: expected a str or TrainingInput, got {type(value).__name__}"
            )
    return out


__all__ = ["TrainingInput", "ChannelSpec", "channels_from_inputs"]


def s3_input(s3_data: str, **kwargs: Any) -> TrainingInput:
    """SageMaker SDK v1's ``s3_input`` (``sagemaker.session.s3_input``): a TrainingInput,
    with a DeprecationWarning.

    Args:
        s3_data: As TrainingInput's.
        **kwargs: TrainingInput's other arguments.
    """
    import warnings

    warnings.warn(
        "s3_input is SageMaker SDK v1's name; use TrainingInput (same arguments)",
        DeprecationWarning,
        stacklevel=2,
    )
    return TrainingInput(s3_data, **kwargs)
