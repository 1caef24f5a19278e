"""Consistency models and worker liveness: pure decisions, no sockets, no clocks read.

Why pure: whether a request may proceed is the part of a parameter server that is
easy to get subtly wrong (deadlocks when a worker dies, a bound off by one), so it
lives here as small functions and a table that tests can step through.

Modes
-----
``async`` (default, SageMaker/TensorFlow semantics)
    every push is applied the moment it arrives; pulls never wait.
``bounded`` (``max_staleness=s``, stale synchronous parallel)
    worker steps are counted per worker; a request of a worker at step ``t``
    waits while ``t - min(progress of live workers) > s``, where a worker's
    progress is one past the highest step it has pushed. ``s = 0`` is lock-step
    at the granularity of a push. ``async`` plus a ``max_staleness`` means
    ``bounded``.
``sync``
    each key aggregates one gradient from every live worker, averages them and
    applies the optimizer once; a pull from a worker whose gradient is still
    pending waits for that update. A worker that leaves or misses heartbeats is
    dropped from the live set and the round proceeds without it (its gradient,
    if it already arrived, still counts). With ``expected_workers`` set, no
    round completes before that many distinct workers have joined once.

Liveness: every message (heartbeats included) refreshes a worker; one silent for
longer than the heartbeat timeout is dead until it speaks again (a restarted
worker with the same id simply rejoins).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import PSConfigError

ASYNC = "async"
BOUNDED = "bounded"
SYNC = "sync"
MODES = (ASYNC, BOUNDED, SYNC)


@dataclass(frozen=True)
class Consistency:
    """A validated consistency setting."""

    mode: str = ASYNC
    max_staleness: int | None = None

    @classmethod
    def parse(cls, mode: str = ASYNC, max_staleness: int | None = None) -> Consistency:
        """Validate user input; PSConfigError with what to use instead."""
        mode = (mode or ASYNC).lower()
        if mode in ("ssp", "stale", "bounded_staleness"):
            mode = BOUNDED
        if mode not in MODES:
            raise PSConfigError(
                f"unknown consistency mode {mode!r}; use 'async' (default), 'bounded' "
                "(with max_staleness) or 'sync'"
            )
        if max_staleness is not None:
            if isinstance(max_staleness, bool) or not isinstance(max_staleness, int):
                raise PSConfigError(f"max_staleness must be an integer >= 0, got {max_staleness!r}")
            if max_staleness < 0:
                raise PSConfigError(f"max_staleness must be >= 0, got {max_staleness}")
            if mode == SYNC:
                raise PSConfigError(
                    "max_staleness does not apply to mode 'sync'; drop it or use 'bounded'"
                )
            mode = BOUNDED
        elif mode == BOUNDED:
            raise PSConfigError("mode 'bounded' needs max_staleness=s (an integer >= 0)")
        return cls(mode, max_staleness)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_staleness": self.max_staleness}


@dataclass
class WorkerState:
    """What a shard knows about one worker."""

    worker: int
    live: bool = True
    last_seen: float = 0.0
    progress: int = 0  # one past the highest step pushed
    rejoins: int = 0
    left: bool = False  # said LEAVE (its process may still run: saving, evaluating)


@dataclass
class WorkerTable:
    """Membership and progress of the workers one shard has heard from."""

    heartbeat_timeout: float = 10.0
    workers: dict[int, WorkerState] = field(default_factory=dict)

    def seen(self, worker: int, now: float) -> bool:
        """Record a message from ``worker``; True when it (re)joins the live set."""
        st = self.workers.get(worker)
        if st is None:
            self.workers[worker] = WorkerState(worker, True, now)
            return True
        st.last_seen = now
        st.left = False
        if not st.live:
            st.live = True
            st.rejoins += 1
            return True
        return False

    def leave(self, worker: int) -> bool:
        """Mark ``worker`` gone; True if it was live."""
        st = self.workers.get(worker)
        if st is None or not st.live:
            return False
        st.live = False
        st.left = True
        return True

    def expire(self, now: float) -> list[int]:
        """Workers silent for longer than the timeout become dead; returns them."""
        dead = [
            w
            for w, st in self.workers.items()
            if st.live and now - st.last_seen > self.heartbeat_timeout
        ]
        for w in dead:
            self.workers[w].live = False
        return dead

    def live(self) -> set[int]:
        return {w for w, st in self.workers.items() if st.live}

    def is_live(self, worker: int) -> bool:
        st = self.workers.get(worker)
        return bool(st and st.live)

    def advance(self, worker: int, step: int) -> bool:
        """A push at ``step`` happened; True if the worker's progress moved."""
        st = self.workers.get(worker)
        if st is None:
            st = self.workers[worker] = WorkerState(worker)
        if step + 1 > st.progress:
            st.progress = step + 1
            return True
        return False

    def min_progress(self, exclude: int | None = None) -> int | None:
        """Slowest live worker's progress (None if no other live worker)."""
        vals = [st.progress for w, st in self.workers.items() if st.live and w != exclude]
        return min(vals) if vals else None

    def resume_step(self, worker: int) -> int:
        """The step a (re)joining worker should continue from: its own progress, or
        the slowest other live worker's, whichever is later (so a worker that was
        away does not hold everyone back under a staleness bound)."""
        own = self.workers[worker].progress if worker in self.workers else 0
        others = self.min_progress(exclude=worker)
        return max(own, others if others is not None else 0)

    def restore(self, progress: dict[int, int]) -> None:
        """Progress from a checkpoint; restored workers are not live until they speak."""
        for w, p in progress.items():
            self.workers[int(w)] = WorkerState(int(w), live=False, progress=int(p))

    def to_json(self) -> dict[str, Any]:
        return {
            str(w): {"live": st.live, "progress": st.progress, "rejoins": st.rejoins}
            for w, st in sorted(self.workers.items())
        }


def staleness_blocked(step: int, min_progress: int | None, max_staleness: int) -> bool:
    """Bounded staleness: may a worker at ``step`` proceed? (True = it must wait)."""
    return min_progress is not None and step - min_progress > max_staleness


def sync_round_ready(contributors: Iterable[int], live: Iterable[int], quorum_met: bool) -> bool:
    """A sync round applies once every live worker has contributed (and it has at least one)."""
    contrib = set(contributors)
    return bool(contrib) and quorum_met and set(live) <= contrib


def job_outcome(
    expected: int,
    exits: Mapping[int, int],
    workers: WorkerTable,
    joined: Iterable[int],
    now: float,
    started: float,
    join_timeout: float,
    done_grace: float = 0.0,
) -> dict[int, dict[str, Any]] | None:
    """Has every worker of the job ended? None while one may still be running, else
    rank -> ``{"exit_code": c}`` (its wrapper reported) or ``{"lost": why}``.

    Why a shard needs this: shards must end by themselves once training is over
    (a parameter server that never exits hangs the job), yet never while a worker
    still needs them. A rank is over when its process reported its exit (DONE), when
    it went silent after joining for longer than the heartbeat timeout *and* the DONE
    grace, or when it never joined within ``join_timeout`` seconds of the shard's start.
    A rank that left cleanly (LEAVE) is given ``join_timeout`` for its DONE: its process
    may still be saving or evaluating, and its wrapper must find the shards there to
    report to. A rank that went silent without LEAVE gets ``done_grace`` (at least the
    heartbeat timeout): its LEAVE may have been lost on a loaded machine, or its script
    dropped the client and went on saving, and its wrapper's DONE, sent only once the
    script's interpreter has exited, can come seconds later. Declaring it lost meanwhile
    failed jobs whose every worker had completed. (Membership for training, e.g. sync
    rounds, still drops a silent worker after the heartbeat timeout: ``expire``.)
    """
    seen = set(joined)
    out: dict[int, dict[str, Any]] = {}
    for rank in range(expected):
        if rank in exits:
            out[rank] = {"exit_code": int(exits[rank])}
            continue
        st = workers.workers.get(rank)
        if rank in seen and st is not None:
            silent = now - st.last_seen
            limit = join_timeout if st.left else max(workers.heartbeat_timeout, done_grace)
            if st.live or silent <= limit:
                return None
            out[rank] = {
                "lost": f"no message for {silent:.0f}s ("
                + (
                    "it left but never reported its end"
                    if st.left
                    else f"heartbeat timeout {workers.heartbeat_timeout:g}s, and no end reported"
                )
                + ")"
            }
        elif now - started < join_timeout:
            return None
        else:
            out[rank] = {"lost": f"never connected within {join_timeout:g}s"}
    return out
