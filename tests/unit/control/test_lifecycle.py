import pytest

from shipyard.control.lifecycle import Event, IllegalTransition, JobState, step


def run(*events):
    state = JobState()
    for e in events:
        state = step(state, e)
    return state


def test_happy_path():
    assert run(Event.DOWNLOADING, Event.TRAINING, Event.UPLOADING, Event.SUCCEEDED) == JobState(
        "Completed", "Completed"
    )


def test_failure_stop_and_max_runtime():
    assert run(Event.TRAINING, Event.FAILED) == JobState("Failed", "Failed")
    assert run(Event.TRAINING, Event.STOP_REQUESTED, Event.STOPPED) == JobState(
        "Stopped", "Stopped"
    )
    assert run(Event.TRAINING, Event.MAX_RUNTIME) == JobState("Stopped", "MaxRuntimeExceeded")


def test_retry_goes_back_through_restarting():
    assert run(Event.TRAINING, Event.RESTARTING, Event.TRAINING) == JobState(
        "InProgress", "Training"
    )


def test_terminal_states_accept_nothing():
    done = run(Event.TRAINING, Event.FAILED)
    for event in Event:
        with pytest.raises(IllegalTransition):
            step(done, event)


def test_no_going_backwards():
    with pytest.raises(IllegalTransition):
        run(Event.TRAINING, Event.DOWNLOADING)
