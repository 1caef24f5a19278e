"""The SageMaker training toolkit's encoding rules (sagemaker_training/mapping.py), exactly.

Scripts written for SageMaker parse argv and SM_* variables built by these rules, so
they are reproduced to the byte: hyperparameters -> ``--key value`` sorted by key
(single letters ``-k``, dicts ``k1=v1,k2=v2``, everything else ``str()``), and
SM_* values as strings as-is, None as "", anything else compact sorted JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SAGEMAKER_PREFIX = "sagemaker_"
# Keys the toolkit treats as its own: they never reach the script's argv or SM_HPS.
RESERVED_HYPERPARAMETERS = (
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_enable_cloudwatch_metrics",
    "sagemaker_region",
    "sagemaker_container_log_level",
    "sagemaker_job_name",
    "default_user_module_name",
    "_tuning_objective_metric",
    "sagemaker_s3_output",
)


def decode_hyperparameters(encoded: Mapping[str, str]) -> dict[str, Any]:
    """hyperparameters.json -> values: each ``json.loads``-ed, falling back to the raw string."""
    out: dict[str, Any] = {}
    for key, value in encoded.items():
        try:
            out[key] = json.loads(value)
        except (ValueError, TypeError):
            out[key] = value
    return out


def split_hyperparameters(hps: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sagemaker/reserved keys, user keys), as ``split_by_criteria`` does."""
    included = {
        k: v
        for k, v in hps.items()
        if k in RESERVED_HYPERPARAMETERS or k.startswith(SAGEMAKER_PREFIX)
    }
    excluded = {k: v for k, v in hps.items() if k not in included}
    return included, excluded


def _decode(obj: Any) -> str:
    if obj is None:
        return ""
    if isinstance(obj, bytes):
        return obj.decode("latin1")
    return str(obj)


def to_cmd_args(mapping: Mapping[str, Any]) -> list[str]:
    """Hyperparameters -> argv, sorted by key (toolkit ``to_cmd_args``)."""
    args: list[str] = []
    for key in sorted(mapping):
        name = _decode(key)
        args.append((f"--{name}" if len(name) > 1 else f"-{name}") if name else "")
        value = mapping[key]
        if hasattr(value, "items"):
            args.append(",".join(f"{k}={v}" for k, v in sorted(value.items())))
        else:
            args.append(_decode(value))
    return args


def env_value(value: Any) -> str:
    """One SM_* value (toolkit ``to_env_vars.format_value``)."""
    if isinstance(value, bytes):
        return value.decode("latin1")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def to_env_vars(mapping: Mapping[str, Any]) -> dict[str, str]:
    """``{key: value}`` -> ``{"SM_KEY": encoded}`` (toolkit ``to_env_vars``)."""
    return {(f"SM_{str(k).upper()}") if k else "": env_value(v) for k, v in mapping.items()}
