"""Consistency settings and worker liveness, stepped with a fake clock."""

from __future__ import annotations

import pytest

from shipyard.ps.consistency import (
    Consistency,
    WorkerTable,
    staleness_blocked,
    sync_round_ready,
)
from shipyard.ps.errors import PSConfigError


def test_parse_modes():
    assert Consistency.parse() == Consistency("async", None)
    assert Consistency.parse("sync") == Consistency("sync", None)
    assert Consistency.parse("async", 2) == Consistency("bounded", 2)  # async + bound = bounded
    assert Consistency.parse("bounded", 0) == Consistency("bounded", 0)
    assert Consistency.parse("SSP", 3).mode == "bounded"


@pytest.mark.parametrize(
    "mode,s,match",
    [
        ("eventual", None, "unknown consistency mode 'eventual'"),
        ("async", -1, "max_staleness must be >= 0"),
        ("bounded", None, "needs max_staleness"),
        ("sync", 1, "does not apply to mode 'sync'"),
        ("async", 1.5, "must be an integer"),
        ("async", True, "must be an integer"),
    ],
)
def test_parse_rejects_bad_settings(mode, s, match):
    with pytest.raises(PSConfigError, match=match):
        Consistency.parse(mode, s)


def test_staleness_bound():
    # a worker at step t may proceed while t - slowest <= s
    assert not staleness_blocked(5, 3, 2)
    assert staleness_blocked(6, 3, 2)
    assert not staleness_blocked(3, 3, 0)
    assert staleness_blocked(4, 3, 0)
    assert not staleness_blocked(100, None, 0)  # alone: nobody to wait for


def test_sync_round_ready():
    assert sync_round_ready({0, 1}, {0, 1}, True)
    assert not sync_round_ready({0}, {0, 1}, True)
    assert sync_round_ready({0, 1}, {0}, True)  # worker 1 died after contributing
    assert not sync_round_ready(set(), set(), True)
    assert not sync_round_ready({0, 1}, {0, 1}, False)  # quorum not reached yet


def test_worker_table_liveness_and_rejoin():
    t = WorkerTable(heartbeat_timeout=5.0)
    assert t.seen(0, 0.0) and t.seen(1, 0.0)
    assert not t.seen(0, 1.0)
    assert t.expire(5.5) == [1]  # 0 was seen at 1.0
    assert t.live() == {0}
    assert t.seen(1, 6.0)  # speaks again: rejoins
    assert t.workers[1].rejoins == 1 and t.live() == {0, 1}
    assert t.leave(0) and not t.leave(0)
    assert t.live() == {1}


def test_progress_and_resume_step():
    t = WorkerTable()
    for w in (0, 1, 2):
        t.seen(w, 0.0)
    t.advance(0, 9)
    t.advance(1, 4)
    t.advance(2, 6)
    assert not t.advance(1, 2)  # progress never goes back
    assert t.min_progress() == 5 and t.min_progress(exclude=1) == 7
    t.leave(1)
    assert t.min_progress() == 7
    # worker 1 comes back: it resumes at the slowest other live worker, not at its old step
    t.seen(1, 1.0)
    assert t.resume_step(1) == 7
    assert t.resume_step(0) == 10  # its own progress is later
    t.restore({5: 3})
    assert not t.is_live(5) and t.workers[5].progress == 3
