"""Patience with a store that is briefly away: retry with backoff, say so, and give up only
when the caller's time is spent.

botocore's own retries last seconds (``SHIPYARD_S3_MAX_ATTEMPTS``); a restarted
``shipyard server`` is away for tens of seconds, and a finished job's artifacts are worth
waiting for (issue 37): the job's models are on disk, only the store is missing. So a caller
that may wait (``control.artifacts``) wraps its transfer in :func:`patiently`, which retries
a ``StorageUnavailableError`` (no connection, a dropped one, a timeout, a 5xx) with
exponential backoff until ``Patience.seconds`` have passed or a stop is requested, and says
when it starts waiting, every minute while it waits, and when the store answers again. Any
other ``StorageError`` (a missing bucket, refused credentials) is not retried: waiting
would not change the answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from shipyard.errors import StorageUnavailableError

T = TypeVar("T")
FIRST_DELAY = 0.5
MAX_DELAY = 15.0
REMIND_SECONDS = 60.0  # how often a long wait says it is still waiting
STOP_CHECK_SECONDS = 0.5


def _nothing(_: str) -> None:
    return None


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Patience:
    """How long to wait for the store (``seconds``) and why that long (``why``, said in
    the messages); ``say(message)`` reports the wait (a job's log and StatusMessage);
    ``should_stop()`` ends it early (a stop request)."""

    seconds: float
    why: str = ""
    say: Callable[[str], None] = _nothing
    should_stop: Callable[[], bool] = _never


def patiently(
    what: str,
    call: Callable[[], T],
    patience: Patience,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, retried while it raises StorageUnavailableError and ``patience`` lasts;
    ``what`` names the transfer in the messages ("uploading s3://b/job/output/model.tar.gz").
    The last StorageUnavailableError, with how long it waited, when the time is spent."""
    start = clock()
    delay = FIRST_DELAY
    waiting = False
    next_reminder = 0.0
    why = f" ({patience.why})" if patience.why else ""
    while True:
        try:
            result = call()
        except StorageUnavailableError as exc:
            elapsed = clock() - start
            left = patience.seconds - elapsed
            if left <= 0:
                raise StorageUnavailableError(
                    f"{exc}; gave up {what} after waiting {elapsed:.0f} s for the store{why}"
                ) from None
            if not waiting:
                patience.say(
                    f"waiting for the store: {exc}; retrying {what} for up to {left:.0f} s{why}"
                )
                waiting = True
                next_reminder = elapsed + REMIND_SECONDS
            elif elapsed >= next_reminder:
                patience.say(
                    f"still waiting for the store after {elapsed:.0f} s ({what}); "
                    f"{left:.0f} s left{why}"
                )
                next_reminder = elapsed + REMIND_SECONDS
            _pause(min(delay, left), patience, clock, sleep)
            if patience.should_stop():
                raise StorageUnavailableError(
                    f"{exc}; stopped waiting for the store after {clock() - start:.0f} s: "
                    f"a stop was requested ({what})"
                ) from None
            delay = min(delay * 2, MAX_DELAY)
            continue
        if waiting:
            patience.say(f"the store answered again after {clock() - start:.0f} s; {what}: done")
        return result


def _pause(
    seconds: float,
    patience: Patience,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> None:
    """Sleep ``seconds``, in slices short enough to notice a stop request."""
    end = clock() + seconds
    while (now := clock()) < end and not patience.should_stop():
        sleep(min(STOP_CHECK_SECONDS, end - now))
