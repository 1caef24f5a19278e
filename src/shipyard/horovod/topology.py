"""Where each rank sits: rank/size, local_rank/local_size, cross_rank/cross_size.

In shipyard every instance is a host ``algo-k``. In local mode all instances run on one
machine, so anything that looks at the real machine (hostname, MPI's shared-memory split,
``OMPI_COMM_WORLD_LOCAL_*`` when mpirun was told about only one node) would call them all
one host. The runner therefore exports, per rank:

    HOROVOD_HOSTNAME     the instance (algo-k)            HOROVOD_LOCAL_RANK / HOROVOD_LOCAL_SIZE
    HOROVOD_CROSS_RANK / HOROVOD_CROSS_SIZE

Order of preference, per quantity: the HOROVOD_* variables (when every rank has them), then
``OMPI_COMM_WORLD_LOCAL_RANK/LOCAL_SIZE``, then grouping the ranks by host key (HOROVOD_HOSTNAME,
else the machine's hostname) as gathered from all ranks at init. cross_rank/cross_size are
Horovod's: the rank and size among the ranks that share this local_rank.

Everything here is pure: ``derive_topology`` takes the gathered per-rank facts and returns the
same answer on every rank.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankFacts:
    """What one rank knows about itself before any exchange (gathered from all ranks)."""

    host: str
    local_rank: int | None = None  # HOROVOD_LOCAL_RANK
    local_size: int | None = None  # HOROVOD_LOCAL_SIZE
    cross_rank: int | None = None  # HOROVOD_CROSS_RANK
    cross_size: int | None = None  # HOROVOD_CROSS_SIZE
    ompi_local_rank: int | None = None  # OMPI_COMM_WORLD_LOCAL_RANK
    ompi_local_size: int | None = None  # OMPI_COMM_WORLD_LOCAL_SIZE


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    source: str  # "horovod-env" | "ompi-env" | "hosts" : where local_* came from (for logs)


def _int(env: Mapping[str, str], key: str) -> int | None:
    v = env.get(key)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        return None


def local_facts(env: Mapping[str, str] | None = None, hostname: str | None = None) -> RankFacts:
    env = os.environ if env is None else env
    host = env.get("HOROVOD_HOSTNAME") or hostname or socket.gethostname()
    return RankFacts(
        host=host,
        local_rank=_int(env, "HOROVOD_LOCAL_RANK"),
        local_size=_int(env, "HOROVOD_LOCAL_SIZE"),
        cross_rank=_int(env, "HOROVOD_CROSS_RANK"),
        cross_size=_int(env, "HOROVOD_CROSS_SIZE"),
        ompi_local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
        ompi_local_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
    )


def _pairs(facts: Sequence[RankFacts], a: str, b: str) -> list[tuple[int, int]] | None:
    """Every rank's (``a``, ``b``) facts, or None when some rank lacks one of them."""
    pairs = [(getattr(f, a), getattr(f, b)) for f in facts]
    if any(x is None or y is None for x, y in pairs):
        return None
    return pairs


def derive_topology(rank: int, facts: Sequence[RankFacts]) -> Topology:
    """The topology of ``rank`` given every rank's facts (index = rank)."""
    size = len(facts)
    me = facts[rank]

    local: list[tuple[int, int]] | None = _pairs(facts, "local_rank", "local_size")
    source = "horovod-env"
    if local is None:
        local = _pairs(facts, "ompi_local_rank", "ompi_local_size")
        source = "ompi-env"
    if local is None:
        by_host: dict[str, list[int]] = {}
        for r, f in enumerate(facts):
            by_host.setdefault(f.host, []).append(r)
        local = [(0, 0)] * size
        for ranks in by_host.values():
            for i, r in enumerate(ranks):
                local[r] = (i, len(ranks))
        source = "hosts"

    cross = _pairs(facts, "cross_rank", "cross_size")
    if cross is not None:
        cross_rank, cross_size = cross[rank]
    else:
        my_local = local[rank][0]
        peers = [r for r in range(size) if local[r][0] == my_local]
        cross_rank, cross_size = peers.index(rank), len(peers)

    return Topology(
        rank=rank,
        size=size,
        local_rank=int(local[rank][0]),
        local_size=int(local[rank][1]),
        cross_rank=int(cross_rank),
        cross_size=int(cross_size),
        hostname=me.host,
        source=source,
    )
