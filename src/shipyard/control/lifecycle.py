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

TERMINAL = ("Completed", "Failed", "Stopped")


class Event(str, Enum):
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
    status: str = "InProgress"
    secondary: str = "Starting"

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class IllegalTransition(Exception):
    pass


_IN_PROGRESS = {
    Event.DOWNLOADING: JobState("InProgress", "Downloading"),
    Event.TRAINING: JobState("InProgress", "Training"),
    Event.UPLOADING: JobState("InProgress", "Uploading"),
    Event.SUCCEEDED: JobState("Completed", "Completed"),
    Event.FAILED: JobState("Failed", "Failed"),
    Event.RESTARTING: JobState("InProgress", "Restarting"),
    Event.STOP_REQUESTED: JobState("Stopping", "Stopping"),
    Event.STOPPED: JobState("Stopped", "Stopped"),
    Event.MAX_RUNTIME: JobState("Stopped", "MaxRuntimeExceeded"),
}
_STOPPING = {
    Event.STOPPED: JobState("Stopped", "Stopped"),
    Event.FAILED: JobState("Failed", "Failed"),
    Event.MAX_RUNTIME: JobState("Stopped", "MaxRuntimeExceeded"),
    Event.STOP_REQUESTED: JobState("Stopping", "Stopping"),
    # A stop that arrives while artifacts are being saved still lets them finish.
    Event.SUCCEEDED: JobState("Stopped", "Stopped"),
    Event.UPLOADING: JobState("Stopping", "Stopping"),
}
_ORDER = ["Starting", "Restarting", "Downloading", "Training", "Uploading"]


def step(state: JobState, event: Event) -> JobState:
    """The state after ``event``; raises IllegalTransition for impossible moves."""
    if state.terminal:
        raise IllegalTransition(f"job is {state.status}; {event.value} is not possible")
    table = _IN_PROGRESS if state.status == "InProgress" else _STOPPING
    if event not in table:
        raise IllegalTransition(f"{state.status}/{state.secondary} does not accept {event.value}")
    new = table[event]
    if (
        state.status == "InProgress"
        and new.status == "InProgress"
        and event is not Event.RESTARTING
        and _ORDER.index(new.secondary) < _ORDER.index(state.secondary)
    ):
        raise IllegalTransition(f"cannot go back from {state.secondary} to {new.secondary}")
    return new
