"""The options of a shipyard.ps job, validated in one place (pure: no numpy).

Why here: the control plane checks ``distribution={'parameter_server': {...}}`` at
submission, before anything starts, and must not pay for importing numpy to do it;
the runner then plans processes from the same parsed object, and the placement code
takes its policy names from here, so a name is never accepted by one and refused by
another.

Options (all optional) inside the ``parameter_server`` dict::

    policy             auto (default: the one that balances best) | round_robin |
                       greedy_bytes | sliced
    consistency        async (default) | bounded (needs max_staleness) | sync
    max_staleness      integer >= 0 (bounded staleness; with async it means bounded)
    num_shards         shard processes in the job (default: one per instance); shard
                       i runs on instance i % instance_count
    workers_per_host   worker processes per instance (default 1); processes_per_host is
                       accepted as a synonym
    port               first TCP port of an instance's shards (default 7100)
    heartbeat_timeout  seconds without a message after which a worker is lost (10)
    checkpoint_interval seconds between periodic shard checkpoints (60; 0: only at the end)
    mac                aes-gmac | poly1305 | hmac-sha256 | blake3 (default: aes-gmac when available)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .consistency import Consistency
from .errors import PSConfigError

ROUND_ROBIN = "round_robin"
GREEDY_BYTES = "greedy_bytes"
SLICED = "sliced"
AUTO = "auto"
POLICIES = (ROUND_ROBIN, GREEDY_BYTES, SLICED)
DEFAULT_PORT = 7100
MAX_SHARDS_PER_HOST = 16
MACS = ("aes-gmac", "poly1305", "hmac-sha256", "blake3")
# keys the distribution layer owns (or adds) and this module ignores
_PASSTHROUGH = ("enabled", "implementation", "kind")
_KNOWN = (
    "policy",
    "consistency",
    "max_staleness",
    "num_shards",
    "workers_per_host",
    "processes_per_host",
    "port",
    "heartbeat_timeout",
    "checkpoint_interval",
    "mac",
)


def check_policy(policy: str) -> str:
    """Validate a policy name (``auto`` or one of POLICIES)."""
    if policy != AUTO and policy not in POLICIES:
        raise PSConfigError(
            f"unknown placement policy {policy!r}; use one of: auto, " + ", ".join(POLICIES)
        )
    return policy


def _int(options: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PSConfigError(
            f"parameter_server option {key!r} must be an integer in [{low}, {high}], got {value!r}"
        )
    return value


def _seconds(options: Mapping[str, Any], key: str, default: float, allow_zero: bool) -> float:
    value = options.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise PSConfigError(
            f"parameter_server option {key!r} must be a number of seconds {bound}, got {value!r}"
        )
    return float(value)


@dataclass(frozen=True)
class PSOptions:
    """A job's validated parameter-server options."""

    policy: str
    consistency: Consistency
    num_shards: int
    workers_per_host: int
    port: int
    heartbeat_timeout: float
    checkpoint_interval: float
    mac: str | None

    @classmethod
    def parse(cls, options: Mapping[str, Any], instance_count: int) -> PSOptions:
        """Validate ``options``; PSConfigError saying what to change."""
        unknown = sorted(k for k in options if k not in _KNOWN and k not in _PASSTHROUGH)
        if unknown:
            raise PSConfigError(
                f"unknown parameter_server option(s) {unknown}; known: {', '.join(_KNOWN)}"
            )
        policy = options.get("policy", AUTO)
        if not isinstance(policy, str):
            raise PSConfigError(
                f"parameter_server option 'policy' must be a string, got {policy!r}"
            )
        check_policy(policy)
        mode = options.get("consistency", "async")
        if not isinstance(mode, str):
            raise PSConfigError(
                f"parameter_server option 'consistency' must be a string, got {mode!r}"
            )
        consistency = Consistency.parse(mode, options.get("max_staleness"))
        wph = _int(options, "workers_per_host", options.get("processes_per_host", 1), 1, 256)
        if "processes_per_host" in options and options["processes_per_host"] != wph:
            raise PSConfigError(
                "processes_per_host and workers_per_host disagree; give only workers_per_host"
            )
        num_shards = _int(
            options, "num_shards", instance_count, 1, MAX_SHARDS_PER_HOST * instance_count
        )
        shards_here = -(-num_shards // instance_count)
        port = _int(options, "port", DEFAULT_PORT, 1024, 65535 - shards_here)
        mac = options.get("mac")
        if mac is not None and mac not in MACS:
            raise PSConfigError(f"parameter_server option 'mac' must be one of {MACS}, got {mac!r}")
        return cls(
            policy=policy,
            consistency=consistency,
            num_shards=num_shards,
            workers_per_host=wph,
            port=port,
            heartbeat_timeout=_seconds(options, "heartbeat_timeout", 10.0, False),
            checkpoint_interval=_seconds(options, "checkpoint_interval", 60.0, True),
            mac=mac,
        )

    def shards_on(self, host_index: int, instance_count: int) -> list[int]:
        """Indexes of the shards that run on instance ``host_index`` (0-based)."""
        return list(range(host_index, self.num_shards, instance_count))

    def shard_endpoint(self, shard: int, addresses: list[str]) -> str:
        """``tcp://ip:port`` of ``shard``; ``addresses`` are the instances' IPs in host order."""
        n = len(addresses)
        return f"tcp://{addresses[shard % n]}:{self.port + shard // n}"
