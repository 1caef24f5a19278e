"""control.submitted_plan: a retry launches the plan that was submitted (issue 37)."""

from __future__ import annotations

import os

import pytest

from shipyard.control.submitted_plan import SubmittedPlan


def test_restore_puts_back_a_rewritten_plan_and_leaves_an_unchanged_one(tmp_path):
    path = tmp_path / "agent.json"
    path.write_text('{"sandbox": {"mode": "on"}}')
    plan = SubmittedPlan(str(path))
    assert plan.restore() is False
    path.write_text('{"sandbox": {"mode": "off"}}')
    assert plan.restore() is True
    assert path.read_text() == '{"sandbox": {"mode": "on"}}'
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"  # it holds the job's secret


def test_a_link_in_place_of_the_plan_is_replaced_not_followed(tmp_path):
    path = tmp_path / "agent.json"
    path.write_text("{}")
    plan = SubmittedPlan(str(path))
    other = tmp_path / "other.json"
    other.write_text("HOST")
    os.remove(path)
    os.symlink(other, path)
    assert plan.restore() is True
    assert other.read_text() == "HOST" and not os.path.islink(path)
    os.remove(path)
    os.symlink(other, path)
    with pytest.raises(OSError):
        SubmittedPlan(str(path))  # never read through a link
