"""TensorFlow's ParameterServerStrategy as its coordinator runs it (issue 39).

Keras ``fit`` under ParameterServerStrategy (the tf2 layout: a worker and a ps on every
instance, one coordinator) is not the per-worker loop :func:`model.parameter_server`
models, where every worker runs a fixed number of steps and the slowest paces the job.
What the runs' placement reports and traffic timelines showed (examples/tensorflow/
cifar10_ps.py, 2 and 3 instances at 100 Mbit/s, three sittings):

- **Placement.** TensorFlow deals variables round-robin by creation order, and an
  optimizer's slots (``RMSprop/dense/kernel/rms``) go on their variable's ps, taking no
  turn. Of the CNN's 10.0 MB (5.0 MB of variables, 5.0 MB of RMSprop slots) all but
  5.7 KB sat on one ps at 2 instances (the kernels alternate with the biases), 9.5 MB at
  3; re-placing slots as variables of their own split it 5/5. At the measured count the
  measured shards are used (the counter also counts variables the report does not list:
  the 3-instance run's first kernel took the turn after two unlisted ones); at other
  counts, round-robin over the variables the report lists, slots left out.
- **Traffic.** A worker step pulls the trainable variables of every ps on another
  instance and sends their gradients back (the apply runs on the ps); slots and the
  optimizer's scalars never cross. Measured: 5.00 MB pulled per worker step at 2
  instances (30.0 MB over 6 steps, 210.1 MB over 42), 4.76 MB from the hot ps at 3. The
  gradients are not in the ps relays' counts (TensorFlow's receiver asks for a tensor
  over its own connection to the sender), but they cross: the remote worker's step took
  ~0.9 s, the time of 5 MB each way at 100 Mbit/s and not of the pull alone.
- **Dispatch.** The coordinator hands each step to whichever worker is free, so a
  worker beside the hot ps (no NIC for its bytes) runs many steps while a remote one
  runs few: 42 of 48 steps at 2 instances, 35-37 at 3. Keras waits for every step of an
  epoch before the next (``on_epoch_end`` joins the coordinator), so the epoch waits for
  the remote workers' steps in flight when its queue runs dry (:func:`epoch_s`, an
  expected tail); where the steps per epoch are unknown, the job's rate is the sum of
  the workers' rates.
- **Sharing.** All the workers' transfers are taken to run at once, each direction of
  each NIC shared fairly among the flows crossing it (processor sharing: a small flow
  finishes early, the big ones split the rest), so the hot ps' NIC carries every remote
  worker's pulls and gradients, and a worker beside it still waits its share for the
  small ps elsewhere (3 instances: ~0.16 s a step where it computes 0.07 s; measured
  0.17-0.2 s while it ran).

Not modelled: at 2 instances the worker beside the hot ps ran ~100 ms a step at 100
Mbit/s (its unshaped step: 63-67 ms; the model gives it 64-68 ms). Its few bytes for the
other ps and the coordinator's call of every step cross the links the remote worker's
5 MB transfers fill, and an emulated link is a FIFO queue (tbf, up to 100 ms) where this
model shares fairly; that worker's steps, and so the job's, are predicted 20-35% fast
there from a quiet reference (issue 39's runs, BENCHMARKS.md).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from shipyard.planner import model

COORDINATOR = "coordinator"


def _slot_of(key: str, primaries: set[str]) -> bool:
    """Whether ``key`` names an optimizer slot of a listed variable: ``<variable>/<slot>``
    (TF1's optimizers) or ``<optimizer>/<variable>/<slot>`` (Keras' optimizer_v2)."""
    head = key.rpartition("/")[0]
    return bool(head) and (head in primaries or head.partition("/")[2] in primaries)


def read_placement(
    entries: Sequence[Mapping[str, Any]], shards: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """From a TensorFlow placement report's entries (creation order): the bytes each
    round-robin turn puts on the wire per step (a trainable variable's bytes, or each
    chunk's for a partitioned one; 0 for a non-trainable variable, which takes a turn
    but never crosses), slots left out; and the trainable bytes each of ``shards`` ps
    held as measured."""
    primaries: set[str] = set()
    turns: list[float] = []
    loads = [0.0] * shards
    for entry in entries:
        key = str(entry.get("key") or "")
        trainable = bool(entry.get("trainable", True))
        if not trainable and _slot_of(key, primaries):
            continue
        primaries.add(key)
        chunks = entry.get("chunks") or [
            {"shard": (entry.get("shard") or [0])[0], "bytes": entry.get("bytes") or 0}
        ]
        for chunk in chunks:
            wire = float(chunk.get("bytes") or 0) if trainable else 0.0
            turns.append(wire)
            shard = int(chunk.get("shard") or 0)
            if 0 <= shard < shards:
                loads[shard] += wire
    return tuple(turns), tuple(loads)


def steps_per_epoch(timing: Mapping[str, Any]) -> int | None:
    """The steps of one of a Keras coordinator's epochs: its timing marks the first
    epoch as warm-up (``tf/steptiming.py``), so that epoch's steps are the warm-up
    count, when it ran more than one epoch (None otherwise: unknown)."""
    if timing.get("Source") != "keras fit" or int(timing.get("Workers") or 0) != 1:
        return None
    warm, run = int(timing.get("WarmupStepsExcluded") or 0), int(timing.get("StepsRun") or 0)
    return warm if 0 < warm < run else None


def shard_loads(profile: model.Profile, n: int, placement: str | None) -> list[float]:
    """Trainable bytes per ps at ``n`` instances: as measured at the measured count (the
    job's own placement), else round-robin by turns (or ``placement``, the advice's)."""
    if placement is None and len(profile.ps_loads) == n:
        return list(profile.ps_loads)
    return model.place(profile.variables, n, placement or "round_robin", profile.chunk_bytes)


class _Pipe:
    """One direction of one NIC and the flows crossing it, all started together."""

    def __init__(self, flows: Sequence[float]) -> None:
        self.sizes = sorted(flows)
        self.before = [0.0]
        for f in self.sizes:
            self.before.append(self.before[-1] + f)

    def finish(self, size: float) -> float:
        """Processor sharing: the bytes' worth of time after which a flow of ``size``
        ends (each smaller flow's bytes, then ``size`` for every flow not smaller)."""
        k = bisect.bisect_left(self.sizes, size)
        return self.before[k] + size * (len(self.sizes) - k)


def worker_comm(
    loads: Sequence[float], n: int, per_host: int, push: float, pull: float
) -> tuple[list[float], float]:
    """Per worker (worker w on instance w // per_host, ps j on instance j % n): the
    bytes' worth of link time of its pulls then its pushes, every worker's at once on
    fairly shared NIC directions; and the busiest direction's bytes of one global step."""
    workers = n * per_host
    flows: dict[tuple[str, int], list[float]] = {}
    mine: list[list[tuple[str, float, tuple[str, int], tuple[str, int]]]] = []
    for w in range(workers):
        h = w // per_host
        moves = []
        for j, tensor in enumerate(loads):
            s = j % n
            if s == h or tensor <= 0:
                continue
            moves.append(("pull", tensor * pull, ("out", s), ("in", h)))
            moves.append(("push", tensor * push, ("out", h), ("in", s)))
        for _, size, a, b in moves:
            flows.setdefault(a, []).append(size)
            flows.setdefault(b, []).append(size)
        mine.append(moves)
    pipes = {hop: _Pipe(sizes) for hop, sizes in flows.items()}
    comm = []
    for moves in mine:
        phase = {"pull": 0.0, "push": 0.0}
        for kind, size, a, b in moves:
            took = max(pipes[a].finish(size), pipes[b].finish(size))
            phase[kind] = max(phase[kind], took)
        comm.append(phase["pull"] + phase["push"])
    busiest = max((sum(f) for f in flows.values()), default=0.0)
    return comm, busiest


def epoch_s(step_s: Sequence[float], steps: int) -> float:
    """The expected time ``steps`` steps take when each goes to the first free worker
    (worker w takes ``step_s[w]``; all start together) and the epoch ends with its last
    step (Keras' join at the epoch's end).

    As a renewal estimate, not a step-by-step replay: the queue of steps runs dry once
    every worker has started its share, at ``(steps - W) / sum(1 / t_w)``, and the epoch
    then waits for the steps in flight, each an independent uniform part of its step
    (the expected longest, :func:`expected_max_residual`), never below ``steps`` at the
    workers' summed rate. Why: which worker takes an
    epoch's last steps turns on milliseconds the model does not have. Replayed exactly,
    the 2-instance cifar10_ps job jumped from 8.9 to 16.6 steps/s for a 0.3 ms change in
    its compute (63.3 ms is where the worker beside the hot ps finishes the epoch's
    other 14 steps before the remote worker's first ends); measured, its remote worker
    ran 2 steps of every epoch in all four sittings, with a reference of 63-99 ms."""
    workers = len(step_s)
    if steps <= 0 or workers == 0:
        return 0.0
    if steps <= workers:  # one step each for the fastest, all at once
        return sorted(step_s)[steps - 1]
    rate = sum(1.0 / t for t in step_s)
    dry = (steps - workers) / rate
    # never below the steps' work at the workers' rates (a lone worker's S steps take
    # S times its step: its phase is no chance)
    return max(dry + expected_max_residual(step_s), steps / rate)


def expected_max_residual(step_s: Sequence[float]) -> float:
    """E[max_w U_w], U_w uniform on [0, t_w] and independent: the integral of
    ``1 - prod_w min(x / t_w, 1)`` over [0, max t], exact piece by piece between the
    sorted step times (on each piece the product is over the workers still running)."""
    ordered = sorted(t for t in step_s if t > 0)
    total, low = 0.0, 0.0
    for k, high in enumerate(ordered):
        running = ordered[k:]  # the workers whose step outlasts this piece
        m = len(running)

        def part(x: float, running: Sequence[float] = running) -> float:
            product = 1.0
            for t in running:
                product *= x / t
            return x * product

        total += (high - low) - (part(high) - part(low)) / (m + 1)
        low = high
    return total


def row(
    profile: model.Profile, link: model.Link, n: int, placement: str | None = None
) -> model.Row:
    """The row of a ParameterServerStrategy job on ``n`` instances (module docstring):
    worker steps per second of the whole job, a worker's step being the job's workers
    over that rate (what the Keras timing records), at most what the shared cores allow."""
    loads = shard_loads(profile, n, placement)
    per_host = profile.processes_per_host
    comm, busiest = worker_comm(loads, n, per_host, profile.push_overhead, profile.pull_overhead)
    steps = [profile.compute_s + (link.seconds(c, 2) if c > 0 else 0.0) for c in comm]
    workers = len(steps)
    if profile.steps_per_epoch:
        rate = profile.steps_per_epoch / epoch_s(steps, profile.steps_per_epoch)
    else:
        rate = sum(1.0 / t for t in steps)
    host = model.shared_host_step(profile.compute_s, workers, profile.host_cores)
    cores_bound = host > 0 and workers / host < rate
    if cores_bound:
        rate = workers / host
    step = workers / rate
    waited = max(0.0, step - profile.compute_s)
    hot = max(range(n), key=lambda j: loads[j])
    share = loads[hot] / (sum(loads) or 1.0)
    imbalanced = n > 1 and share > 1.5 / n
    name = "compute"
    if cores_bound:
        name = "host CPU"
    elif waited > profile.compute_s:
        name = f"hot ps:{hot}" if imbalanced else "nic"
    result = model.Row(
        instance_type=link.name,
        instances=n,
        distribution=profile.distribution,
        steps_per_s=rate,
        step_s=step,
        efficiency=profile.compute_s / step,
        compute_s=profile.compute_s,
        comm_s=waited,
        bottleneck=name,
        busiest_bytes=busiest,
    )
    if name.startswith("hot ps") and placement is None:
        result = model.spread(
            profile, link, n, result, f"ps:{hot} holds {share:.0%} of the bytes: "
        )
    return result


def compute_of(profile: model.Profile, link: model.Link, n: int, step_s: float) -> float:
    """The compute per step under which :func:`row` gives the measured ``step_s`` (a
    worker's step: the job's workers over its rate), by bisection (the row's step grows
    with the compute); at least ``model.MIN_COMPUTE_SHARE`` of the step."""
    floor = step_s * model.MIN_COMPUTE_SHARE
    low, high = floor, step_s
    if row(replace(profile, compute_s=low), link, n).step_s >= step_s:
        return floor
    for _ in range(60):
        mid = (low + high) / 2
        if row(replace(profile, compute_s=mid), link, n).step_s < step_s:
            low = mid
        else:
            high = mid
        if high - low <= step_s * 1e-9 or math.isclose(low, high):
            break
    return (low + high) / 2


model.PS_DISPATCH[COORDINATOR] = ("tf_parameter_server", row)
