"""The DDP contract as pure functions: who is which rank, what each rank's environment
holds, which ports are tried, which store keys mean "this rank joined".

Everything here is a function of its arguments (no sockets, no torch) so tests can
compare it byte for byte with what torchrun sets
(torch/distributed/elastic/agent/server/local_elastic_agent.py ``_start_workers`` and
torch/distributed/run.py's OMP_NUM_THREADS rule).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# SageMaker's torch_distributed launcher passes --master_port 7777 to torchrun.
DEFAULT_MASTER_PORT = 7777
PORT_CANDIDATES = 16
# torchrun's default rendezvous join timeout (--rdzv-conf join_timeout=900).
DEFAULT_RENDEZVOUS_TIMEOUT = 900.0
# How long a rank waits for algo-1's rendezvous service to answer (it imports torch
# first, slow on a loaded machine); not the join timeout. If algo-1 dies instead, its
# failure ends the job long before this.
DISCOVERY_TIMEOUT = 900.0
ROLE_NAME = "default"  # torchrun's default --role
_ANNOUNCE_BASE, _ANNOUNCE_SPAN, ANNOUNCE_CANDIDATES = 20000, 20000, 8


@dataclass(frozen=True)
class Rank:
    """One rank's place in the job (torchrun's Worker + WorkerGroup numbers)."""

    rank: int
    local_rank: int
    group_rank: int  # the instance's index (torchrun's node rank)
    local_world_size: int  # processes per host
    group_world_size: int  # instance count

    @property
    def world_size(self) -> int:
        return self.local_world_size * self.group_world_size


def ranks_of(group_rank: int, local_world_size: int, group_world_size: int) -> list[Rank]:
    """The ranks instance ``group_rank`` runs: contiguous, as torchrun assigns them."""
    first = group_rank * local_world_size
    return [
        Rank(first + i, i, group_rank, local_world_size, group_world_size)
        for i in range(local_world_size)
    ]


def describe_rank(rank: int, hosts: list[str], local_world_size: int) -> str:
    """``rank 3 (algo-2, local rank 1)``: how failures and timeouts name a rank."""
    host = hosts[rank // local_world_size] if rank // local_world_size < len(hosts) else "?"
    return f"rank {rank} ({host}, local rank {rank % local_world_size})"


def rank_env(
    rank: Rank,
    *,
    master_addr: str,
    master_port: int,
    restart_count: int,
    max_restarts: int,
    run_id: str,
    inherited: dict[str, str],
    error_file: str | None = None,
) -> dict[str, str]:
    """The variables torchrun gives one worker, exactly as it encodes them.

    ``inherited`` is the environment the rank would otherwise get: torchrun keeps a
    user's OMP_NUM_THREADS and TORCH_NCCL_ASYNC_ERROR_HANDLING and, with more than one
    process per node, sets OMP_NUM_THREADS=1 when the user did not.
    """
    env = {
        "RANK": str(rank.rank),
        "GROUP_RANK": str(rank.group_rank),
        "ROLE_RANK": str(rank.rank),
        "ROLE_NAME": ROLE_NAME,
        "LOCAL_WORLD_SIZE": str(rank.local_world_size),
        "WORLD_SIZE": str(rank.world_size),
        "GROUP_WORLD_SIZE": str(rank.group_world_size),
        "ROLE_WORLD_SIZE": str(rank.world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": inherited.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "LOCAL_RANK": str(rank.local_rank),
    }
    if "OMP_NUM_THREADS" in inherited:
        env["OMP_NUM_THREADS"] = inherited["OMP_NUM_THREADS"]
    elif rank.local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    if "CUDA_VISIBLE_DEVICES" in inherited:
        env["CUDA_VISIBLE_DEVICES"] = inherited["CUDA_VISIBLE_DEVICES"]
    if error_file is not None:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    return env


def master_ports(base: int = DEFAULT_MASTER_PORT, count: int = PORT_CANDIDATES) -> list[int]:
    """MASTER_PORT candidates, tried in order on algo-1's address: the first free wins."""
    return [p for p in range(base, base + count) if p < 65536]


def announce_ports(job_secret: str, job_name: str) -> list[int]:
    """Where algo-1's rendezvous service can be asked for the chosen MASTER_PORT.

    Derived from the job's secret, so every instance (on any machine) computes the same
    list without talking first, and two jobs rarely share one.
    """
    digest = hashlib.sha256((job_secret or job_name).encode()).digest()
    base = _ANNOUNCE_BASE + int.from_bytes(digest[:4], "big") % _ANNOUNCE_SPAN
    return list(range(base, base + ANNOUNCE_CANDIDATES))


# gloo writes one key per rank while building the default process group:
# ``default_pg/<group>//cpu//<tag>/<rank>`` (PrefixStore layers over the job's store).
_GLOO_JOIN_KEY = re.compile(r"^default_pg/[^/]*//cpu//\d+/(\d+)$")


def joined_ranks(keys: list[str]) -> set[int]:
    """Ranks that created the default process group's CPU (gloo) backend.

    NCCL-only groups write no per-rank key, so on a GPU-only group nobody is seen to
    join and the join watch never starts (it can never fire falsely).
    """
    found = set()
    for key in keys:
        match = _GLOO_JOIN_KEY.match(key)
        if match:
            found.add(int(match.group(1)))
    return found


def missing_ranks_message(
    missing: list[int], joined: int, hosts: list[str], local_world_size: int, timeout: float
) -> str:
    """The failure text of a rendezvous that timed out, naming every missing rank."""
    shown = ", ".join(describe_rank(r, hosts, local_world_size) for r in missing[:16])
    more = f" and {len(missing) - 16} more" if len(missing) > 16 else ""
    world = len(hosts) * local_world_size
    return (
        f"RendezvousTimeoutError: {len(missing)} of {world} ranks never joined the "
        f"process group within {timeout:g}s of the first one ({joined} joined): "
        f"{shown}{more}. They did not call torch.distributed.init_process_group() "
        "(stuck or slow before it?). Raise the distribution's 'rendezvous_timeout' "
        "if they only need longer."
    )
