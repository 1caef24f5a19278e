"""The job lifecycle as an explicit state machine with a pure ``step`` (Ray Train v2 style).

TrainingJobStatus / SecondaryStatus exactly as SageMaker names them:

    InProgress: Starting -> Downloading -> Training -> Uploading
                (Restarting, back to Starting, between retried attempts)
    Stopping:   Stopping
    Completed:  Completed
    Failed:     Failed
    Stopped:    Stopped | MaxRuntimeExceeded

Terminal states accept no event: a finished job record can never be flipped back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from shipyard.errors import ShipyardError


class StrEnum(str, Enum):
    """A str-valued enum that prints, formats and serializes as its value (Python 3.10's
    ``(str, Enum)`` does not format as its value on 3.11+; ``enum.StrEnum`` is 3.11 only).

    Stored rows, JSON and describe() keep the plain strings SageMaker uses."""

    def __str__(self) -> str:
        return str(self.value)


class JobStatus(StrEnum):
    """TrainingJobStatus."""

    IN_PROGRESS = "InProgress"
    STOPPING = "Stopping"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"


class SecondaryStatus(StrEnum):
    """SecondaryStatus (the ones a local job goes through)."""

    STARTING = "Starting"
    RESTARTING = "Restarting"
    DOWNLOADING = "Downloading"
    TRAINING = "Training"
    UPLOADING = "Uploading"
    STOPPING = "Stopping"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"
    MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"


class InstanceStatus(StrEnum):
    """One instance of one attempt (the instances table, describe's Shipyard.Instances)."""

    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"


class AttemptKind(StrEnum):
    """How one attempt of a job ended (the supervisor's AttemptResult)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    MAX_RUNTIME = "max_runtime"


TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED)


class Event(StrEnum):
    DOWNLOADING = "downloading"  # channels / code being made available
    TRAINING = "training"  # instances launched
    UPLOADING = "uploading"  # every instance succeeded, artifacts being saved
    SUCCEEDED = "succeeded"  # artifacts saved
    FAILED = "failed"  # an instance or the platform failed
    RESTARTING = "restarting"  # a failed attempt will be retried
    STOP_REQUESTED = "stop_requested"
    STOPPED = "stopped"
    MAX_RUNTIME = "max_runtime"  # max_run reached: stopped, artifacts kept


@dataclass(frozen=True)
class JobState:
    status: JobStatus = JobStatus.IN_PROGRESS
    secondary: SecondaryStatus = SecondaryStatus.STARTING

    def __post_init__(self) -> None:
        # stored rows hand in plain strings; an unknown one raises ValueError naming it
        object.__setattr__(self, "status", JobStatus(self.status))
        object.__setattr__(self, "secondary", SecondaryStatus(self.secondary))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class IllegalTransition(ShipyardError):
    """A status change the lifecycle table does not allow (a bug, or two writers)."""


_IN_PROGRESS = {
    Event.DOWNLOADING: JobState(JobStatus.IN_PROGRESS, SecondaryStatus.DOWNLOADING),
    Event.TRAINING: JobState(JobStatus.IN_PROGRESS, SecondaryStatus.TRAINING),
    Event.UPLOADING: JobState(JobStatus.IN_PROGRESS, SecondaryStatus.UPLOADING),
    Event.SUCCEEDED: JobState(JobStatus.COMPLETED, SecondaryStatus.COMPLETED),
    Event.FAILED: JobState(JobStatus.FAILED, SecondaryStatus.FAILED),
    Event.RESTARTING: JobState(JobStatus.IN_PROGRESS, SecondaryStatus.RESTARTING),
    Event.STOP_REQUESTED: JobState(JobStatus.STOPPING, SecondaryStatus.STOPPING),
    Event.STOPPED: JobState(JobStatus.STOPPED, SecondaryStatus.STOPPED),
    Event.MAX_RUNTIME: JobState(JobStatus.STOPPED, SecondaryStatus.MAX_RUNTIME_EXCEEDED),
}
_STOPPING = {
    Event.STOPPED: JobState(JobStatus.STOPPED, SecondaryStatus.STOPPED),
    Event.FAILED: JobState(JobStatus.FAILED, SecondaryStatus.FAILED),
    Event.MAX_RUNTIME: JobState(JobStatus.STOPPED, SecondaryStatus.MAX_RUNTIME_EXCEEDED),
    Event.STOP_REQUESTED: JobState(JobStatus.STOPPING, SecondaryStatus.STOPPING),
    # A stop that arrives while artifacts are being saved still lets them finish.
    Event.SUCCEEDED: JobState(JobStatus.STOPPED, SecondaryStatus.STOPPED),
    Event.UPLOADING: JobState(JobStatus.STOPPING, SecondaryStatus.STOPPING),
}
_ORDER = [
    SecondaryStatus.STARTING,
    SecondaryStatus.RESTARTING,
    SecondaryStatus.DOWNLOADING,
    SecondaryStatus.TRAINING,
    SecondaryStatus.UPLOADING,
]


def step(state: JobState, event: Event) -> JobState:
    """The state after ``event``; raises IllegalTransition for impossible moves."""
    if state.terminal:
        raise IllegalTransition(f"job is {state.status}; {event.value} is not possible")
    table = _IN_PROGRESS if state.status is JobStatus.IN_PROGRESS else _STOPPING
    if event not in table:
        raise IllegalTransition(f"{state.status}/{state.secondary} does not accept {event.value}")
    new = table[event]
    if (
        state.status is JobStatus.IN_PROGRESS
        and new.status is JobStatus.IN_PROGRESS
        and event is not Event.RESTARTING
        and _ORDER.index(new.secondary) < _ORDER.index(state.secondary)
    ):
        raise IllegalTransition(f"cannot go back from {state.secondary} to {new.secondary}")
    return new
