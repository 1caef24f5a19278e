"""The estimator says what its instance_type maps to once per job, not also when it is
built (the control plane's submission already logs the line: it used to appear twice)."""

from __future__ import annotations

import logging

import shipyard


def test_instance_type_line_is_logged_once_per_job(session, write_script, caplog):
    caplog.set_level(logging.INFO, logger="shipyard")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", "print('hi')\n"),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est._submit(session.control, None, "one-line")  # what fit() does before it runs the job
    lines = [r.getMessage() for r in caplog.records if "instance_type 'local'" in r.getMessage()]
    assert len(lines) == 1, lines
