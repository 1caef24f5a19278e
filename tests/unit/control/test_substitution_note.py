"""A failed job whose framework version was substituted says so in its FailureReason: the
note comes from the job's framework-environment record, and only when the version differs."""

from __future__ import annotations

import json

from shipyard.control.envphase import substitution_note
from shipyard.control.reading import FRAMEWORK_ENV_NAME


def _record(tmp_path, **env):
    (tmp_path / FRAMEWORK_ENV_NAME).write_text(json.dumps(env))
    return str(tmp_path)


def test_a_substituted_version_is_named_with_the_asked_one(tmp_path):
    job_dir = _record(
        tmp_path, Framework="tensorflow", Asked="2.4.1", Version="2.13.1", Exact=False
    )
    note = substitution_note(job_dir)
    assert note is not None
    assert note.startswith(
        "Framework: tensorflow 2.13.1 ran, not the asked framework_version '2.4.1'"
    )


def test_an_exact_version_or_no_record_adds_nothing(tmp_path):
    assert substitution_note(str(tmp_path)) is None
    exact = _record(tmp_path, Framework="tensorflow", Asked="2.13.1", Version="2.13.1", Exact=True)
    assert substitution_note(exact) is None


def test_a_pending_or_unreadable_record_adds_nothing(tmp_path):
    pending = _record(tmp_path, Framework="tensorflow", Asked="2.4.1", Version=None, Exact=None)
    assert substitution_note(pending) is None
    (tmp_path / FRAMEWORK_ENV_NAME).write_text("{not json")
    assert substitution_note(str(tmp_path)) is None
