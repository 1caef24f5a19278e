"""ShardedByS3Key: which objects an instance gets.

Objects are dealt round-robin over the sorted hosts in key order, so every instance
computes the same split without talking to the others, the shards are disjoint and
their union is the whole channel (SageMaker: "approximately 1/n of the objects").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def shard(objects: Sequence[T], hosts: Sequence[str], host: str) -> list[T]:
    ordered = sorted(hosts, key=_host_key)
    index = ordered.index(host)
    return [obj for i, obj in enumerate(objects) if i % len(ordered) == index]


def _host_key(host: str) -> tuple[int, str]:
    """algo-2 before algo-10 (numeric order), anything else by name."""
    prefix, _, number = host.rpartition("-")
    return (int(number), prefix) if number.isdigit() else (0, host)


def select(objects: Sequence[T], distribution: str, hosts: Sequence[str], host: str) -> list[T]:
    if distribution == "ShardedByS3Key" and len(hosts) > 1:
        return shard(objects, hosts, host)
    return list(objects)
