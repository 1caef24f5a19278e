"""The performance model: one step of data-parallel training as compute plus link time.

Every distribution is reduced to the bytes each instance's NIC must send and receive per
step (AWS rates an instance's bandwidth per direction, so each direction of each NIC is a
separate pipe) plus a latency per sequential message. Traffic between processes of the
same instance is free (it never crosses the NIC). The model does not assume that
communication overlaps computation: on the CPUs this model is checked on, gloo and the
parameter-server clients compete with compute for the same cores, so a step is
``compute + communication`` (``Profile.overlap`` lets a caller who has measured overlap say
otherwise, and ``Profile.overlap_window`` is the part of the compute a job's pushed
gradients were measured to travel behind: shipyard.ps pushes each gradient from
backward's hooks, so up to that much of the link's time hides, :func:`hidden_s`).

- **Ring allreduce** (Horovod, torch_distributed, MultiWorkerMirrored): every rank sends and
  receives ``2(R-1)/R * S`` bytes for S gradient bytes over R ranks, in ``2(R-1)`` sequential
  hops per fused buffer. With the ring ordered by host exactly one ring edge leaves each
  instance, so that is also each NIC's load.
  Open MPI's default for a few ranks and megabytes (measured here, 2-4 ranks, 5 MB) is a
  reduce to rank 0 then a broadcast, ``2(N-1) * S`` through rank 0's NIC one after the
  other: ``Profile.allreduce = "reduce_bcast"`` models it (CPU jobs of the ``mpi``
  distribution on Open MPI's TCP transport; NCCL and gloo rings are ``ring``).
- **SageMaker's data-parallel library** reduces inside an instance first and balances the
  inter-node part over every node's CPU servers: ``2(N-1)/N * S`` per node over N instances
  but only two sequential phases per buffer, not ``2(R-1)`` hops; it runs only on the
  instance types it supports.
- **Parameter servers** (TensorFlow's, shipyard.ps): each worker pulls each variable from
  its server and pushes its gradient back; the bytes per server follow the placement of
  the variables (re-placed for each instance count with the job's policy). The busiest
  NIC (usually the one of the server holding the most bytes: a *hot* ps) paces a global
  step; ``sync`` waits for it every step, ``async``/bounded staleness are capped by it.
  That is a job whose every worker runs its own loop (shipyard.ps, TF1's
  ``replica_device_setter``: ``Profile.dispatch`` "worker"). TensorFlow's
  ParameterServerStrategy hands each step to whichever worker is free, so a worker
  beside the hot ps runs most of them: ``dispatch`` "coordinator",
  :mod:`shipyard.planner.coordinator` (slots on their variable's ps, only trainable bytes
  on the wire, the job's rate the workers' together up to Keras' join each epoch).
- **A shared host** (``Profile.host_cores``): an emulated run puts every instance on one
  machine, so its W workers share that machine's C cores, while each one's network wait
  leaves its core to the others. The cores then do at most ``C / compute`` worker steps
  per second between them: a worker's step is at least ``W * compute / C``, and the
  row's step is ``max(compute + communication, W * compute / C)`` (the busiest resource
  paces a pipeline), bottleneck ``host CPU`` when the second wins. A synchronous
  collective (allreduce, SageMaker's library) is no pipeline: every rank computes, then
  all communicate, so the sharing stretches only the compute phase and the step is
  ``max(compute, W * compute / C) + communication`` (measured: Horovod on 3 instances at
  1 Gbit/s ran 240 ms per step, the max form said 211 ms, this one 230 ms). A real cluster's
  instances each have their own cores, so this applies only to predicting a run on the
  machine that measured (``shipyard plan --shared-host CORES``, the accuracy benchmark).
- **The same machine** (:func:`same_machine`, :class:`Machine` from
  :mod:`shipyard.planner.ceiling`): a run emulated here gets neither the emulated rate
  nor cores of its own. Its link is ``min(emulated rate, this machine's ceiling)``, the
  ceiling being what two instances here measured moving each way at once (``tc`` slows a
  link, it cannot speed the machine up: two shared cores moved 8-12 Gbit/s each way, so
  a 10 Gbit/s emulation is capped, bottleneck ``host network``); and its K workers share
  the machine's N cores as above (compute stretched to ``K * compute / N`` once K > N).
  Parameter servers are not counted among K: their CPU is the data path's own, paced by
  the bytes, which the ceiling measured with its senders and receivers on the same cores.
  Where the ceiling could not be measured there is no prediction (:class:`Unpredictable`
  says why), not a number that ignores it.
  **shipyard.ps' own CPU** (``Machine.ps_cpu_s_per_byte``, measured between two instances
  here by :mod:`shipyard.planner.transport_probe`): every worker's step pushes its
  gradient and pulls the values back through client, shard and kernel, on the same
  shared cores, whatever the link's rate. A global step then needs ``K * compute + X``
  CPU-seconds, X = that cost per byte x ``2 * K * gradient bytes``, so a step lasts at
  least ``(K * compute + X) / N``, bottleneck ``host CPU`` when that wins. Measured
  (issue 39, the demo's CNN on 2 instances, 2 cores): 33 ms of compute and 9.3 ms of
  push/pull a step at 10 Gbit/s where the link needs 4.8 ms; the step, 41 ms, is the
  two workers' compute plus ~18 ms of transport CPU over two cores. Only shipyard.ps
  (the transport probed), and only in a same-machine prediction (``Profile.
  host_cpu_s_per_byte``, set by :func:`same_machine` and a same-machine reading): a real
  cluster's instances have cores of their own.
  The compute a same-machine run measured is wall time, and the transport's work that
  ran while the workers computed (shards, client I/O threads, the kernel's TCP) is in
  it; the cores' bound nets that share out (``Profile.transport_in_compute``, the share
  of the time in flight the ps client measured behind compute, :func:`own_compute_s`)
  before adding the transport's CPU whole, so it is counted once. And the wait after
  compute adds, after the link's exposed time, what the measured run waited beyond it
  (``Profile.transport_wait_s``, :func:`waited_s`): the transport's own processing of a
  step's last pieces, which a faster emulated link does not shorten.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

ALLREDUCE = ("horovod", "torch_distributed", "multi_worker_mirrored")
SMDDP = "smdistributed"
PS = ("tf_parameter_server", "shipyard_ps")
PLAIN = "none"
DISTRIBUTIONS = (*ALLREDUCE, SMDDP, *PS, PLAIN)
PLACEMENTS = ("round_robin", "greedy_bytes", "sliced", "auto")
# Fused buffer per collective: Horovod's HOROVOD_FUSION_THRESHOLD default (64 MiB),
# DDP's bucket_cap_mb default (25 MiB); TF's collective ops pack every gradient into one.
DEFAULT_FUSION_BYTES = {
    "horovod": 64 * 2**20,
    "torch_distributed": 25 * 2**20,
    "multi_worker_mirrored": 0,
    SMDDP: 64 * 2**20,
}
# Instance types SageMaker's data-parallel library runs on (its documentation).
SMDDP_TYPES = frozenset(
    {"ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge"}
)
# shipyard.ps' default chunk of a sliced variable (shipyard.ps.placement)
DEFAULT_CHUNK_BYTES = 2 << 20
# Latency of one message between two instances in a cluster placement group.
DEFAULT_LATENCY_S = 100e-6
# Bytes a link carries per byte of payload over TCP: a 1500-byte MTU holds 1448 bytes of
# payload (IPv4 20 + TCP 20 + timestamps 12), and the frame is 1514 with Ethernet's 14,
# which is what a NIC's rate (and tc's tbf on a veth) counts. Measured: 10 MB between 2
# instances shaped to 50 Mbit/s took 1.68 s, the payload alone implies 1.60 s, 1.60 x
# 1514/1448 = 1.67 s (tests/integration/sandbox/test_shaping.py).
TCP_FRAMING = 1514 / 1448
FASTER_PLACEMENT = {
    "tf_parameter_server": (
        "a partitioner (tf.distribute.experimental.partitioners.MinSizePartitioner) or "
        "shipyard.ps' size-balanced placement would spread them"
    ),
    "shipyard_ps": "shipyard.ps' placement policy 'sliced' (or 'greedy_bytes') would spread them",
}


@dataclass(frozen=True)
class Link:
    """One instance's NIC: bytes per second each direction and the latency of a message.

    ``framing``: bytes on the wire per byte of payload (:data:`TCP_FRAMING` for a real or
    emulated NIC carrying TCP; 1.0 for the payload-only arithmetic of hand-computed cases)."""

    name: str
    bytes_per_s: float
    latency_s: float = DEFAULT_LATENCY_S
    framing: float = 1.0

    def seconds(self, nbytes: float, messages: int = 0) -> float:
        return nbytes * self.framing / self.bytes_per_s + messages * self.latency_s


@dataclass(frozen=True)
class Profile:
    """What a job does per step, independent of where it runs.

    ``compute_s`` is one worker's compute per step (forward, backward, update); where it
    came from (measured here, given by the user for a GPU type) is ``compute_source``.
    ``variables`` are the trainable variables' bytes in creation order: the gradient of
    a step is their sum, and parameter-server placement re-deals them. ``push_overhead``
    and ``pull_overhead`` are measured wire bytes per tensor byte (framing, headers).
    """

    distribution: str
    compute_s: float
    variables: tuple[float, ...]
    compute_source: str = "measured"
    processes_per_host: int = 1
    placement: str = "round_robin"
    consistency: str = "async"
    push_overhead: float = 1.0
    pull_overhead: float = 1.0
    fusion_bytes: int | None = None
    chunk_bytes: float = DEFAULT_CHUNK_BYTES  # of a sliced parameter-server variable
    overlap: float = 0.0  # share of the communication hidden behind compute (0..1)
    allreduce: str = "ring"  # or "reduce_bcast": what Open MPI's default picks for few ranks
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_cores: float | None = None  # every instance on one machine of this many cores
    # CPU seconds the transport costs the shared cores per payload byte moved (a pushed
    # or pulled byte): set only for a same-machine prediction of shipyard.ps
    host_cpu_s_per_byte: float = 0.0
    # measured by the job (the shipyard.ps client's split, a same-machine reading): the
    # share of a worker's compute that its pushed gradients travel behind (the overlap
    # window over the compute; 0: not measured, ``overlap`` applies), and the share of
    # the transport's CPU that ran while the workers computed (their measured compute
    # holds it: the shared cores' bound takes it out before adding the transport's CPU)
    overlap_window: float = 0.0
    transport_in_compute: float = 0.0
    # and the seconds of its wait after compute that its link did not explain (the
    # transport's own processing of a step's last pieces: a floor of the wait)
    transport_wait_s: float = 0.0
    # how steps reach the workers: "worker" (each runs its own loop: the slowest paces a
    # global step) or "coordinator" (TensorFlow's ParameterServerStrategy hands each step
    # to a free worker: planner/coordinator.py), with the trainable bytes each ps held
    # as measured (used at that count) and the steps between the coordinator's joins
    dispatch: str = "worker"
    ps_loads: tuple[float, ...] = ()
    steps_per_epoch: int | None = None

    @property
    def gradient_bytes(self) -> float:
        return sum(self.variables)


@dataclass(frozen=True)
class Row:
    """The prediction for one (instance type, count, distribution)."""

    instance_type: str
    instances: int
    distribution: str
    steps_per_s: float  # worker steps per second over the whole job (samples / batch)
    step_s: float  # one worker's time per step
    efficiency: float  # steps_per_s / (workers x a lone worker's rate)
    compute_s: float
    comm_s: float
    bottleneck: str  # "compute", "nic", "hot ps:<j>", "host CPU", "unsupported"
    advice: str = ""
    speedup: float | None = None  # of following the advice
    busiest_bytes: float = 0.0  # per step, the busiest NIC direction

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def ring_bytes(gradient_bytes: float, ranks: int) -> float:
    """Bytes each rank sends (and receives) in one ring allreduce: 2(R-1)/R * S."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * gradient_bytes


def buffers(gradient_bytes: float, fusion_bytes: int | None) -> int:
    """Fused collectives per step: one per ``fusion_bytes`` of gradient (0: one in all)."""
    if not fusion_bytes or gradient_bytes <= 0:
        return 1
    return max(1, math.ceil(gradient_bytes / fusion_bytes))


def place(
    variables: Sequence[float], shards: int, policy: str, chunk_bytes: float = DEFAULT_CHUNK_BYTES
) -> list[float]:
    """Tensor bytes each of ``shards`` parameter servers holds under ``policy`` (the same
    rules as :mod:`shipyard.ps.placement`, on sizes only).

    round_robin: by creation order (TensorFlow's default); greedy_bytes: largest first
    onto the least loaded; sliced: variables above ``chunk_bytes`` cut into chunks of
    that size, then every piece greedily; auto: shipyard.ps' choice, the best balanced
    of the three (ties: the earlier one).
    """
    if policy not in PLACEMENTS:
        raise ValueError(f"placement {policy!r}: use one of {', '.join(PLACEMENTS)}")
    if policy == "auto":
        options = [place(variables, shards, p, chunk_bytes) for p in PLACEMENTS[:3]]
        return min(options, key=lambda loads: round(max(loads), 6))
    loads = [0.0] * shards
    if policy == "round_robin":
        for i, b in enumerate(variables):
            loads[i % shards] += b
        return loads
    pieces: list[float] = []
    for b in variables:
        if policy == "sliced" and b > chunk_bytes:
            whole, rest = divmod(b, chunk_bytes)
            pieces.extend([chunk_bytes] * int(whole) + ([rest] if rest else []))
        else:
            pieces.append(b)
    for b in sorted(pieces, reverse=True):
        j = loads.index(min(loads))
        loads[j] += b
    return loads


def shared_host_step(
    compute_s: float, workers: int, host_cores: float | None, extra_cpu_s: float = 0.0
) -> float:
    """The shortest worker step ``workers`` processes sharing ``host_cores`` cores allow:
    together they have ``host_cores`` CPU-seconds per second and each step costs one
    worker ``compute_s`` of them, plus ``extra_cpu_s`` for all of them together (the
    transport's CPU of one global step), so a step lasts at least
    ``(workers * compute_s + extra_cpu_s) / cores`` (0 where the workers have cores of
    their own and nothing else runs on them: ``host_cores`` None, or enough of them and
    no extra)."""
    if not host_cores or (workers <= host_cores and extra_cpu_s <= 0):
        return 0.0
    return (workers * compute_s + extra_cpu_s) / host_cores


# The floor of a compute derived from a communication-bound step. It was a tenth, which
# overrode real measurements: 2 Horovod instances at 100 Mbit/s measured 873 ms per step
# against 837 ms of predicted communication, 36 ms of compute (42 ms measured unshaped),
# and the floor made it 87 ms, predicting the 1 Gbit/s runs 30% slow.
MIN_COMPUTE_SHARE = 0.02


def collective(distribution: str) -> bool:
    """Whether every rank waits for the others each step (a synchronous allreduce)."""
    return distribution in ALLREDUCE or distribution == SMDDP


def compute_of(
    step_s: float,
    comm_s: float,
    workers: int,
    host_cores: float | None,
    collective: bool = False,
    extra_cpu_s: float = 0.0,
) -> float:
    """The compute per step that explains a measured ``step_s``: the inverse of
    ``max(compute + comm, workers * compute / cores)`` or, for a synchronous collective,
    of ``max(compute, workers * compute / cores) + comm`` (see ``_row``). In the first
    both terms grow with compute, so the compute is the smaller of the two that each
    alone would explain (never below ``MIN_COMPUTE_SHARE`` of the step: a communication
    estimate above the measured step is the model's error, not a step without compute).
    ``extra_cpu_s``: the transport's CPU of one global step on the shared cores (the
    second form is then ``(workers * compute + extra) / cores``)."""
    floor = step_s * MIN_COMPUTE_SHARE
    stretch = workers / host_cores if host_cores and workers > host_cores else 1.0
    if collective:
        return max((step_s - comm_s) / stretch, floor)
    candidates = [step_s - comm_s]
    if host_cores and (stretch > 1.0 or extra_cpu_s > 0):
        candidates.append((step_s * host_cores - extra_cpu_s) / workers)
    return max(min(candidates), floor)


def transport_cpu_s(profile: Profile, workers: int) -> float:
    """The transport's CPU-seconds of one global step on a shared host: every worker
    pushes its gradient and pulls the values back, at ``host_cpu_s_per_byte``."""
    return profile.host_cpu_s_per_byte * 2 * workers * profile.gradient_bytes


def hidden_s(profile: Profile, comm: float) -> float:
    """The communication of a step hidden behind its compute: with a measured overlap
    window (``Profile.overlap_window``), as much of ``comm`` as fits in that part of the
    compute (a slow link's transfer outlasts the window, a fast one's fits whole; issue
    39: the demo's CNN pushes its 4.7 MB dense gradient early in backward, and at 1.25
    Gbit/s waited 20 ms of the 37 ms its link needs); else the share ``overlap`` of it."""
    if profile.overlap_window > 0:
        return min(comm, profile.overlap_window * profile.compute_s)
    return min(comm * profile.overlap, profile.compute_s)


def waited_s(profile: Profile, comm: float) -> float:
    """The communication a worker waits for after its compute: what the overlap leaves of
    the link's time, then the wait the measured run's link did not explain
    (``Profile.transport_wait_s``: the shards' updates and replies and the client's
    receive of the last pieces, which come after those pieces crossed the link and do
    not get faster with it; issue 39: at 10 Gbit/s the demo's CNN waited 9.3 ms a step
    for a link that needed 4.8 ms, all of it in flight behind backward)."""
    return comm - hidden_s(profile, comm) + profile.transport_wait_s


def own_compute_s(profile: Profile, workers: int, extra_cpu_s: float) -> float:
    """A worker's compute net of the transport's CPU that ran on the shared cores while it
    computed: the share ``Profile.transport_in_compute`` of the global step's
    ``extra_cpu_s``, spread over the busy cores (one per worker, at most the machine's).
    Why: the compute a same-machine run measured is wall time, stretched by the shards'
    and the clients' I/O work that preempted it; the shared cores' bound adds the
    transport's CPU whole, so it would be counted twice (issue 39: at 10 Gbit/s the
    prediction from the 1.25 Gbit/s run's 34 ms compute was 18% slow)."""
    if not profile.host_cores or profile.transport_in_compute <= 0 or extra_cpu_s <= 0:
        return profile.compute_s
    busy = max(float(workers), profile.host_cores)
    return max(0.0, profile.compute_s - profile.transport_in_compute * extra_cpu_s / busy)


def _row(
    profile: Profile,
    link: Link,
    n: int,
    comm: float,
    busiest: float,
    bottleneck: str,
    collective: bool = False,
) -> Row:
    """One row; ``collective``: every rank waits for the others each step (a synchronous
    allreduce), so a shared host stretches the compute phase, not the whole step."""
    waited = waited_s(profile, comm)
    workers = n * profile.processes_per_host
    alone = profile.compute_s + waited
    extra = transport_cpu_s(profile, workers) if profile.distribution in PS else 0.0
    host = shared_host_step(
        own_compute_s(profile, workers, extra), workers, profile.host_cores, extra
    )
    step = max(profile.compute_s, host) + waited if collective else max(alone, host)
    rate = workers / step
    name = bottleneck if waited > profile.compute_s else "compute"
    if host > alone or (collective and host > profile.compute_s and host > waited):
        name = "host CPU"
    return Row(
        instance_type=link.name,
        instances=n,
        distribution=profile.distribution,
        steps_per_s=rate,
        step_s=step,
        efficiency=profile.compute_s / step,
        compute_s=profile.compute_s,
        comm_s=comm,
        bottleneck=name,
        busiest_bytes=busiest,
    )


def allreduce(profile: Profile, link: Link, n: int) -> Row:
    """A synchronous ring allreduce over ``n`` instances (Horovod, DDP, MWMS)."""
    ranks = n * profile.processes_per_host
    size = profile.gradient_bytes
    fusion = profile.fusion_bytes
    if fusion is None:
        fusion = DEFAULT_FUSION_BYTES.get(profile.distribution, 0)
    if profile.allreduce == "reduce_bcast":
        # a reduce to rank 0, then a broadcast from it, one after the other (intra-
        # instance ranks reduce for free): rank 0's NIC receives (N-1) S, then the
        # broadcast's binomial tree sends S in each of its ceil(log2 N) rounds. Measured at
        # 100 Mbit/s: 2, 4 and 4.9 gradients' time at N = 2, 3, 4 (2(N-1) = 6 at N = 4)
        per_nic = (n - 1) * size
        rounds = math.ceil(math.log2(n)) if n > 1 else 0
        comm = link.seconds(per_nic + rounds * size, 2 * buffers(size, fusion) if n > 1 else 0)
        return _row(profile, link, n, comm, per_nic, "nic", collective=True)
    if profile.allreduce != "ring":
        raise ValueError(f"allreduce {profile.allreduce!r}: use ring or reduce_bcast")
    per_nic = ring_bytes(size, ranks) if n > 1 else 0.0
    hops = 2 * (ranks - 1) * buffers(size, fusion) if n > 1 else 0
    comm = link.seconds(per_nic, hops)
    return _row(profile, link, n, comm, per_nic, "nic", collective=True)


def smddp(profile: Profile, link: Link, n: int) -> Row:
    """SageMaker's data-parallel library: node-level balanced reduce, two phases per buffer."""
    if link.name.startswith("ml.") and link.name not in SMDDP_TYPES:
        return Row(
            link.name, n, SMDDP, 0.0, math.inf, 0.0, profile.compute_s, math.inf,
            "unsupported",
            f"SageMaker's data-parallel library runs only on {', '.join(sorted(SMDDP_TYPES))}",
        )  # fmt: skip
    size = profile.gradient_bytes
    per_nic = ring_bytes(size, n)
    phases = 2 * buffers(size, DEFAULT_FUSION_BYTES[SMDDP]) if n > 1 else 0
    return _row(profile, link, n, link.seconds(per_nic, phases), per_nic, "nic", collective=True)


def nic_loads(
    shard_bytes: Sequence[float], n: int, workers_per_host: int, push: float, pull: float
) -> tuple[list[float], list[float], float]:
    """Per instance (egress, ingress) bytes of one global step (every worker one step),
    with shard j on instance j % n, and the most remote bytes one worker moves (pull then
    push, one after the other: the worker farthest from the bytes paces the step)."""
    egress = [0.0] * n
    ingress = [0.0] * n
    own = 0.0
    for h in range(n):
        mine = 0.0
        for j, tensor in enumerate(shard_bytes):
            server = j % n
            if server == h:
                continue
            up, down = tensor * push * workers_per_host, tensor * pull * workers_per_host
            egress[h] += up
            ingress[server] += up
            egress[server] += down
            ingress[h] += down
            mine += tensor * (push + pull)
        own = max(own, mine)
    return egress, ingress, own


def parameter_server(profile: Profile, link: Link, n: int, placement: str | None = None) -> Row:
    """Parameter servers, one per instance, variables placed with the job's policy."""
    policy = placement or profile.placement
    loads = place(profile.variables, n, policy, profile.chunk_bytes)
    egress, ingress, own = nic_loads(
        loads, n, profile.processes_per_host, profile.push_overhead, profile.pull_overhead
    )
    busiest = max(max(egress), max(ingress))
    hot = max(range(n), key=lambda j: loads[j])
    global_step = link.seconds(busiest)  # the busiest NIC's time for one global step
    worker = link.seconds(own, 2 if n > 1 else 0)  # one pull and one push round trip
    # async and sync alike: a worker waits for its own round trips, and in the time of
    # one step of every worker the busiest NIC must move one global step's bytes. (sync
    # adds a barrier, which costs only with stragglers: this model has none.)
    comm = max(worker, global_step)
    total = sum(loads) or 1.0
    share = loads[hot] / total
    imbalanced = n > 1 and share > 1.5 / n
    row = _row(profile, link, n, comm, busiest, f"hot ps:{hot}" if imbalanced else "nic")
    if row.bottleneck.startswith("hot ps") and placement is None:
        row = spread(profile, link, n, row, f"ps:{hot} holds {share:.0%} of the bytes: ")
    return row


# How a parameter-server job's rows are predicted, by ``Profile.dispatch``: "worker" is
# :func:`parameter_server`; "coordinator" (TensorFlow's ParameterServerStrategy) is added
# by :mod:`shipyard.planner.coordinator`, which builds on this module and registers
# itself when imported (the package imports it), so no import runs back up from here.
PsRow = Callable[[Profile, Link, int, "str | None"], Row]
PS_DISPATCH: dict[str, tuple[str, PsRow]] = {}  # dispatch -> (its distribution, row)


def _ps_row(profile: Profile, link: Link, n: int, placement: str | None = None) -> Row:
    """A parameter-server row as the job's steps are dispatched (``Profile.dispatch``)."""
    if profile.dispatch == "worker":
        return parameter_server(profile, link, n, placement)
    distribution, row = PS_DISPATCH.get(profile.dispatch, ("", parameter_server))
    if distribution and distribution == profile.distribution:
        return row(profile, link, n, placement)
    others = ", ".join(f"'{d}' for {dist}" for d, (dist, _) in sorted(PS_DISPATCH.items()))
    raise ValueError(
        f"dispatch {profile.dispatch!r}: use 'worker'" + (f", or {others}" if others else "")
    )


def spread(profile: Profile, link: Link, n: int, row: Row, why: str) -> Row:
    """Advice for a hot ps: slicing (at the job's chunk size, else at smaller chunks)."""
    small = max(64 * 1024.0, profile.gradient_bytes / (4 * n))
    tries = [("sliced", profile), ("smaller", replace(profile, chunk_bytes=small))]
    best_name, best = max(
        ((name, _ps_row(p, link, n, "sliced")) for name, p in tries),
        key=lambda t: t[1].steps_per_s,
    )
    speedup = best.steps_per_s / row.steps_per_s
    if speedup <= 1.01:
        return row
    if profile.distribution == "tf_parameter_server":
        how = FASTER_PLACEMENT["tf_parameter_server"]
    elif best_name == "sliced":
        how = FASTER_PLACEMENT["shipyard_ps"]
    else:
        how = (
            "shipyard.ps' policy 'sliced' with smaller chunks "
            f"(DistributedOptimizer(chunk_bytes={int(small)})) would spread them"
        )
    return replace(row, advice=f"{why}{how}; predicted speedup x{speedup:.2f}", speedup=speedup)


@dataclass(frozen=True)
class Machine:
    """The one machine an emulated run's instances share: the ``cores`` every instance's
    processes run on and the bytes per second two instances move each way
    (``bytes_per_s``; None where it could not be measured, ``why`` says why), and the
    CPU seconds shipyard.ps' push/pull costs those cores per payload byte
    (``ps_cpu_s_per_byte``; None where it could not be measured, ``ps_why`` says why)."""

    cores: float
    bytes_per_s: float | None
    why: str = ""
    ps_cpu_s_per_byte: float | None = None
    ps_why: str = ""

    def transport_cost(self, distribution: str) -> float:
        """CPU seconds per payload byte a run of ``distribution`` pays on these cores:
        shipyard.ps' measured cost (raises :class:`Unpredictable` where it is unknown);
        0 for the others (their transports were not probed)."""
        if distribution != "shipyard_ps":
            return 0.0
        if self.ps_cpu_s_per_byte is None:
            raise Unpredictable(
                "shipyard.ps' push/pull cost on this machine is unknown "
                f"({self.ps_why or 'not measured'}): `shipyard doctor --measure`"
            )
        return self.ps_cpu_s_per_byte


class Unpredictable(ValueError):
    """A same-machine prediction the model cannot make: the message says why."""


def on_machine(link: Link, machine: Machine) -> Link:
    """The link an emulated run here gets: the emulated rate, at most the machine's."""
    if machine.bytes_per_s is None or machine.bytes_per_s <= 0:
        raise Unpredictable(
            f"this machine's ceiling between instances is unknown ({machine.why or 'not measured'})"
        )
    if link.bytes_per_s <= machine.bytes_per_s:
        return link
    return replace(link, bytes_per_s=machine.bytes_per_s)


def same_machine(profile: Profile, link: Link, n: int, machine: Machine) -> Row:
    """``n`` instances emulating ``link`` on this machine: the link capped at the
    machine's ceiling, the workers sharing its cores (module docstring, "the same
    machine"). ``profile``'s compute must have been read with the same machine
    (``profile.Inputs(machine=...)``). Raises :class:`Unpredictable` without a ceiling."""
    capped = on_machine(link, machine)
    here = replace(
        profile,
        host_cores=machine.cores,
        host_cpu_s_per_byte=machine.transport_cost(profile.distribution),
    )
    row = predict(here, capped, n)
    extra = transport_cpu_s(here, n * here.processes_per_host)
    if row.bottleneck == "host CPU" and extra > 0:
        row = replace(
            row,
            advice=(
                f"shipyard.ps' push/pull costs {extra * 1e3:.1f} ms of CPU a step here (measured "
                f"per byte), on the {machine.cores:g} cores the workers compute on: real "
                f"{link.name} instances have cores of their own"
            ),
        )
    if capped is not link and (row.bottleneck == "nic" or row.bottleneck.startswith("hot ps")):
        gbit = capped.bytes_per_s * 8 / 1e9
        row = replace(
            row,
            bottleneck="host network",
            advice=(
                f"this machine moves {gbit:.1f} Gbit/s between instances, below the emulated "
                f"{link.bytes_per_s * 8 / 1e9:g} Gbit/s: real {link.name} instances would not wait for it"
            ),
        )
    return row


def predict(profile: Profile, link: Link, n: int) -> Row:
    """The row for ``profile`` on ``n`` instances whose NICs are ``link``."""
    if n < 1:
        raise ValueError(f"instances must be at least 1, got {n}")
    if profile.compute_s <= 0:
        raise ValueError("the compute time per step must be positive")
    kind = profile.distribution
    if kind in ALLREDUCE:
        return allreduce(profile, link, n)
    if kind == SMDDP:
        return smddp(profile, link, n)
    if kind in PS:
        return _ps_row(profile, link, n)
    if kind == PLAIN:  # no distribution: every instance trains its own copy, no traffic
        return _row(profile, link, n, 0.0, 0.0, "compute")
    raise ValueError(f"distribution {kind!r}: use one of {', '.join(DISTRIBUTIONS)}")


def advise(row: Row, profile: Profile, link: Link, faster: Link | None = None) -> Row:
    """Fill in what would remove a row's bottleneck (a row that has advice keeps it):
    compression for allreduce, allreduce for parameter servers, a faster network."""
    if row.advice or row.bottleneck == "unsupported":
        return row
    if row.bottleneck == "host CPU":
        workers = row.instances * profile.processes_per_host
        return replace(
            row,
            advice=(
                f"{workers} workers share this machine's {profile.host_cores:g} cores: "
                "instances of their own would not wait for each other's compute"
            ),
        )
    share = row.comm_s / row.step_s if row.step_s else 0.0
    if row.bottleneck == "compute" and share < 0.2:
        return replace(
            row,
            advice="more instances scale; a faster type: give its --compute-time",
        )
    options: list[tuple[str, Row]] = []
    if profile.distribution in ALLREDUCE:
        halved = replace(profile, variables=tuple(v / 2 for v in profile.variables))
        options.append(
            (
                "fp16 compression (hvd.Compression.fp16) halves the bytes",
                predict(halved, link, row.instances),
            )
        )
    elif profile.distribution in PS:
        ring = replace(profile, distribution="horovod")
        options.append(("ring allreduce (Horovod)", predict(ring, link, row.instances)))
    if faster is not None and faster.bytes_per_s > link.bytes_per_s:
        options.append((f"{faster.name}'s network", predict(profile, faster, row.instances)))
    best = max(options, key=lambda o: o[1].steps_per_s, default=None)
    text = f"the NIC ({link.name}) is the bottleneck"
    if row.bottleneck == "compute":
        text = f"compute leads, the network takes {share:.0%} of a step"
    if best is None or best[1].steps_per_s <= row.steps_per_s * 1.01:
        return replace(row, advice=text)
    speedup = best[1].steps_per_s / row.steps_per_s
    return replace(
        row, advice=f"{text}; {best[0]}: predicted speedup x{speedup:.2f}", speedup=speedup
    )


def plan(profile: Profile, links: Sequence[Link], counts: Sequence[int]) -> list[Row]:
    """Every (link, count) row with its advice; the fastest link is offered to the others."""
    fastest = max(links, key=lambda ln: ln.bytes_per_s, default=None)
    rows = []
    for link in links:
        for n in counts:
            rows.append(advise(predict(profile, link, n), profile, link, fastest))
    return rows
