"""The supervisor's rules as objects: retry, root-cause choice, stop, max_run.

Why objects, injected (issue 36): these rules decide how every job ends, and they were
hard-coded in the supervisor's loop, so the only way to test one was to launch a real job
(seconds to minutes each, timing-sensitive). As values with their own parameters (a
settle window, a grace, a max_run of 50 ms) a unit test drives the real supervisor on the
in-process backend (``backends/inprocess.py``) in milliseconds; the defaults
(``Policies.for_spec``) are exactly the rules real jobs always had.

Each policy only decides; the supervisor does (stops instances, writes the store).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shipyard import settings
from shipyard.control.lifecycle import AttemptKind
from shipyard.spec import JobSpec

# After the first failure is seen, how long the other agents get to record theirs: a peer
# failing a few ms later (its connection dropped) may be *seen* first; the earliest
# recorded failure time names the root cause (torch elastic's rule).
ROOT_CAUSE_SETTLE_SECONDS = 0.5
# How often the store is asked whether a stop was requested (a detached supervisor's
# signals are seen at once; StopTrainingJob and `shipyard stop` write the store).
STOP_CHECK_SECONDS = 0.25


@dataclass
class AttemptResult:
    """How one attempt ended; ``host`` names the root cause of a failure."""

    kind: AttemptKind
    reason: str | None = None
    host: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """SageMaker's ``max_retry_attempts``: a failed attempt restarts every instance, up to
    that many more attempts. Only failures retry: a stop or max_run ends the job."""

    max_retry_attempts: int = 0
    retry_on: frozenset[AttemptKind] = frozenset({AttemptKind.FAILED})

    @property
    def attempts_allowed(self) -> int:
        return 1 + self.max_retry_attempts

    def should_retry(self, result: AttemptResult, attempt: int) -> bool:
        """Whether attempt ``attempt``'s ``result`` starts attempt ``attempt + 1``."""
        return result.kind in self.retry_on and attempt < self.attempts_allowed


@dataclass(frozen=True)
class FailurePolicy:
    """Which instance's failure is the job's FailureReason: the one whose agent recorded
    the earliest failure time, not the one the supervisor happened to poll first (a peer's
    failure a few ms later is often noticed first). Only hosts that recorded a failure are
    candidates, so an instance stopped because another failed is never the cause."""

    settle_seconds: float = ROOT_CAUSE_SETTLE_SECONDS

    def settle_until(self) -> float:
        """The monotonic time until which the other agents may still record theirs."""
        return time.monotonic() + self.settle_seconds

    def root_cause(self, seen: str, times: dict[str, float | None]) -> str:
        """The host with the earliest recorded failure time (``times`` in host order);
        ``seen`` (the first failure polled) when no host recorded one."""
        known = {host: t for host, t in times.items() if t is not None}
        if not known:
            return seen
        return min(known, key=lambda host: known[host])  # a tie: the first in host order


@dataclass(frozen=True)
class StopPolicy:
    """A stop (request, signal, the end of an attempt): SIGTERM, ``grace`` seconds, then
    SIGKILL, which the backend carries out. ``grace`` None: SHIPYARD_STOP_GRACE, read
    when a stop happens (a bad value is a SettingError then, never at start)."""

    grace: float | None = None
    check_seconds: float = STOP_CHECK_SECONDS

    def grace_seconds(self) -> float:
        return self.grace if self.grace is not None else settings.number("SHIPYARD_STOP_GRACE")


@dataclass
class MaxRunPolicy:
    """``max_run``: past it the instances are stopped, the artifacts still uploaded, and the
    job ends Stopped/MaxRuntimeExceeded. The clock starts when the supervisor does (the
    environment phase and every attempt count, as SageMaker's does)."""

    max_run: float
    clock: Callable[[], float] = time.monotonic
    deadline: float = field(init=False)
    keeps_artifacts: bool = True

    def __post_init__(self) -> None:
        self.deadline = self.clock() + self.max_run

    def exceeded(self, now: float | None = None) -> bool:
        return (self.clock() if now is None else now) >= self.deadline

    def result(self) -> AttemptResult:
        shown = int(self.max_run) if float(self.max_run).is_integer() else self.max_run
        return AttemptResult(
            AttemptKind.MAX_RUNTIME,
            f"MaxRuntimeExceeded: the job ran longer than max_run={shown} seconds",
        )


@dataclass
class Policies:
    """The four rules one supervisor runs a job by."""

    retry: RetryPolicy
    failure: FailurePolicy
    stop: StopPolicy
    max_run: MaxRunPolicy

    @classmethod
    def for_spec(cls, spec: JobSpec) -> Policies:
        """The rules every real job runs by: its own max_retry_attempts and max_run."""
        return cls(
            RetryPolicy(spec.max_retry_attempts),
            FailurePolicy(),
            StopPolicy(),
            MaxRunPolicy(spec.max_run),
        )

    def uploads(self, kind: AttemptKind) -> bool:
        """Whether an attempt that ended ``kind`` ends the job with its artifacts uploaded:
        a success, and max_run unless the policy says otherwise."""
        return kind is AttemptKind.SUCCEEDED or (
            kind is AttemptKind.MAX_RUNTIME and self.max_run.keeps_artifacts
        )
