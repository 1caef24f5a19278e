"""AgentConfig: what the control plane tells every agent of a job (one JSON file).

Plain JSON and a stdlib dataclass on purpose: the agent must start fast and must not
depend on the control plane's models. control.plan writes it; the agent reads it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class AgentConfig:
    job_name: str
    hosts: list[str]
    addresses: dict[str, str]
    instance_type: str
    num_cpus: int
    num_gpus: int
    hyperparameters: dict[str, str]
    input_data_config: dict[str, dict[str, Any]]
    channel_sources: dict[str, str]
    submit_directory: str
    entry_point: str
    instances_dir: str
    runner: str = "plain"
    runner_options: dict[str, Any] = field(default_factory=dict)
    framework_module: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    network_interface_name: str = "lo"
    extra_python_path: list[str] = field(default_factory=list)
    python_package: bool = False
    checkpoint_local_path: str | None = None
    region: str = "us-east-1"
    log_level: int = 20
    shared_dir: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "AgentConfig":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, path: str) -> "AgentConfig":
        with open(path, encoding="utf-8") as fh:
            return cls.from_json(fh.read())
