"""An ``AgentConfig`` for the agent-side unit tests: a local job with no data, no
hyperparameters and a ``train.py`` entry point, so each test names only what it checks."""

from __future__ import annotations

from typing import Any

from shipyard.jobplan.config import AgentConfig


def local_config(instances_dir: str, addresses: dict[str, str], **fields: Any) -> AgentConfig:
    """A config for the hosts of ``addresses`` (in their order); ``fields`` override."""
    values: dict[str, Any] = dict(
        job_name="j",
        hosts=list(addresses),
        addresses=addresses,
        instance_type="local",
        num_cpus=2,
        num_gpus=0,
        hyperparameters={},
        input_data_config={},
        channel_sources={},
        submit_directory="",
        entry_point="train.py",
        instances_dir=instances_dir,
    )
    values.update(fields)
    return AgentConfig(**values)
