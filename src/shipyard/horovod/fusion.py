"""Tensor fusion: which tensors travel together in one collective.

Horovod packs small tensors into a fusion buffer of at most ``HOROVOD_FUSION_THRESHOLD``
bytes (default 64 MiB) and reduces the buffer with one call: one latency instead of many.
Planning is a pure function of the tensors' byte sizes, so every rank computes the same
plan from the same inputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024
# DDP's idea: the first bucket of the torch optimizer is small so communication starts
# while backward is still running.
FIRST_BUCKET_BYTES = 1024 * 1024


def fusion_threshold(env: Mapping[str, str] | None = None) -> int:
    """``HOROVOD_FUSION_THRESHOLD`` in bytes (0 disables fusion)."""
    env = os.environ if env is None else env
    raw = env.get("HOROVOD_FUSION_THRESHOLD")
    if raw is None or raw.strip() == "":
        return DEFAULT_FUSION_THRESHOLD
    try:
        value = int(float(raw))
    except ValueError as e:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD must be a number of bytes, got {raw!r}") from e
    if value < 0:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD must be >= 0, got {value}")
    return value


def plan_batches(
    nbytes: Sequence[int], threshold: int, first_cap: int | None = None
) -> list[list[int]]:
    """Split tensors (in order) into consecutive batches of at most ``threshold`` bytes.

    A tensor larger than the threshold gets a batch of its own (it is reduced in place,
    without a copy into a fusion buffer). ``threshold == 0`` means no fusion: one tensor per
    batch. ``first_cap`` caps the first batch only (used by the torch optimizer).
    """
    batches: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    cap = threshold if first_cap is None else min(first_cap, threshold)
    for i, n in enumerate(nbytes):
        if threshold <= 0:
            batches.append([i])
            continue
        if current and current_bytes + n > cap:
            batches.append(current)
            current, current_bytes = [], 0
            cap = threshold
        current.append(i)
        current_bytes += n
    if current:
        batches.append(current)
    return batches
