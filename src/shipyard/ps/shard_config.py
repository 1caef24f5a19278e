"""A shard's configuration: everything it needs besides its secret.

Why its own module: the shard's parts (core.py's queues, commands.py's control
requests, ending.py's end of a job) each read it, and server.py builds it from the
command line (its flags map 1:1 onto the fields); it sits below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .consistency import Consistency
from .errors import PSConfigError

DEFAULT_MAX_PAYLOAD = 1 << 30  # 1 GiB per message; tensors above it are sliced by placement


@dataclass
class ServerConfig:
    """Everything a shard needs besides its secret (CLI flags map 1:1 onto these)."""

    index: int = 0
    num_shards: int = 1
    consistency: Consistency = field(default_factory=Consistency)
    heartbeat_timeout: float = 10.0
    expected_workers: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_interval: float = 60.0  # seconds; <= 0 disables periodic checkpoints
    max_payload: int = DEFAULT_MAX_PAYLOAD
    # End once every one of ``expected_workers`` ranks has ended (DONE, lost, or never
    # joined within ``join_timeout``): how shards stop by themselves in a job.
    exit_when_done: bool = False
    join_timeout: float = 600.0
    # A rank silent without LEAVE: how long its wrapper's DONE may take before the job's
    # end counts it lost (consistency.job_outcome); capped by join_timeout.
    done_grace: float = 60.0

    def __post_init__(self) -> None:
        if self.num_shards < 1 or not 0 <= self.index < self.num_shards:
            raise PSConfigError(f"shard index {self.index} not in [0, {self.num_shards})")
        if self.heartbeat_timeout <= 0:
            raise PSConfigError(f"heartbeat_timeout must be > 0, got {self.heartbeat_timeout}")
        if self.expected_workers is not None and self.expected_workers < 1:
            raise PSConfigError(f"expected_workers must be >= 1, got {self.expected_workers}")
        if self.exit_when_done and self.expected_workers is None:
            raise PSConfigError("exit_when_done needs expected_workers (--num-workers)")
        if self.max_payload < 1:
            raise PSConfigError(f"max_payload must be >= 1, got {self.max_payload}")
