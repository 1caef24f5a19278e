"""The unit tier's time guard: a test whose call phase runs over the budget fails, unless it
carries ``@pytest.mark.slow("why")``.

The unit tier is the edit-test loop (``make test-fast``, under a minute on a quiet 2-core
machine). A test that launches a real job, imports a framework or waits out a long timeout
belongs in tests/integration; this guard names one that slipped in, and a hang, at once.
The budget is wall time, so it is scaled by the machine's load (the 1-minute load average
per CPU, never below 1): on a loaded 2-core machine where every test takes four times as
long, the budget is four times as long too, and a quiet machine holds the plain figure.
Setup and teardown (fixtures) are not counted; pytest-timeout still stops a real hang.

It also notes which frameworks were loaded once this run's collection finished
(house/test_collection.py asserts none): collecting imports every collected test module,
so the run itself is the probe, at no cost (the whole suite under ``make test``).
"""

from __future__ import annotations

import os
import sys
import time

import pytest

# seconds of wall for one test's call phase on a quiet machine. Measured (issue 36): the
# slowest unmarked unit tests wait out real timers (the front end's lingering close, 2 x 2 s;
# idle and head deadlines, 2-3.4 s) with little CPU, so their time hardly moves with load;
# the CPU-bound ones (the house's source scans, the SageMaker SDK's image table) took
# 4.5-7 s at load 5 per CPU, where the budget is 25 s. A framework import (10-30 s) or a
# real job trips it on a quiet machine.
CALL_BUDGET_S = 5.0


def load_factor() -> float:
    """How many times slower than quiet this machine runs now (>= 1)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def over_budget(took: float, marker: pytest.Mark | None, factor: float) -> str | None:
    """Why a call phase that took ``took`` seconds fails the test, or None when it may."""
    if marker is not None:
        if not (marker.args and isinstance(marker.args[0], str) and marker.args[0].strip()):
            return 'a slow unit test says why: @pytest.mark.slow("what takes the time")'
        return None
    budget = CALL_BUDGET_S * factor
    if took <= budget:
        return None
    return (
        f"the test's call took {took:.1f} s of wall, over the unit tier's budget of "
        f"{budget:.1f} s ({CALL_BUDGET_S:g} s x load factor {factor:.1f}): move it to "
        'tests/integration, make it faster, or mark it @pytest.mark.slow("why")'
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    start = time.perf_counter()
    result = yield  # a failing test raises here: its own failure is reported, not ours
    reason = over_budget(
        time.perf_counter() - start, item.get_closest_marker("slow"), load_factor()
    )
    if reason is not None:
        pytest.fail(reason, pytrace=False)
    return result


FRAMEWORKS = ("tensorflow", "torch", "ray", "keras", "tf_keras", "jax")
# filled when this process's collection finishes: (frameworks loaded, test files collected)
COLLECTED: tuple[list[str], list[str]] | None = None


def frameworks_in(modules: dict[str, object] | set[str]) -> list[str]:
    """The frameworks among the names of loaded modules (``sys.modules``)."""
    return sorted(m for m in FRAMEWORKS if m in modules)


def pytest_collection_finish(session: pytest.Session) -> None:
    global COLLECTED
    files = sorted({item.nodeid.split("::", 1)[0] for item in session.items})
    COLLECTED = (frameworks_in(sys.modules), files)
