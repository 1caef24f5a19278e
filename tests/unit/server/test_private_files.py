"""The home is the user's alone (0700, tightened when found looser, with group/other bits
dropped from what is already in it), and the server's key is made once per home, 0600."""

from __future__ import annotations

import os
import stat

from shipyard.control.home import PRIVATE_MARK, Home
from shipyard.server import credentials


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_home_is_0700(tmp_path):
    home = tmp_path / "new" / "home"
    Home(str(home)).ensure_private()
    assert mode(home) == 0o700


def test_an_existing_home_is_tightened_once(tmp_path):
    home = tmp_path / "home"
    (home / "jobs" / "j1").mkdir(parents=True)
    job = home / "jobs" / "j1" / "job.json"
    job.write_text("{}")
    tool = home / "envs" / "bin" / "python"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    os.chmod(home, 0o755)
    os.chmod(home / "jobs", 0o755)
    os.chmod(job, 0o644)
    os.chmod(tool, 0o755)
    (home / "link").symlink_to("/etc/hostname")
    before = mode("/etc/hostname")
    Home(str(home)).ensure_private()
    assert mode(home) == 0o700 and mode(home / "jobs") == 0o700
    assert mode(job) == 0o600
    assert mode(tool) == 0o700  # still executable by its owner
    assert mode("/etc/hostname") == before  # links are not followed
    assert (home / PRIVATE_MARK).exists()
    os.chmod(job, 0o644)  # once: a later start does not walk the home again
    os.chmod(home, 0o755)
    Home(str(home)).ensure_private()
    assert mode(home) == 0o700 and mode(job) == 0o644


def test_the_key_is_made_once_per_home_and_private(tmp_path, monkeypatch):
    monkeypatch.delenv("SHIPYARD_SERVER_ACCESS_KEY", raising=False)
    monkeypatch.delenv("SHIPYARD_SERVER_SECRET_KEY", raising=False)
    first = credentials.load(str(tmp_path / "a"))
    assert credentials.load(str(tmp_path / "a")) == first
    assert credentials.load(str(tmp_path / "b"))[1] != first[1]
    assert mode(credentials.path(str(tmp_path / "a"))) == 0o600
    assert mode(tmp_path / "a") == 0o700
    monkeypatch.setenv("SHIPYARD_SERVER_ACCESS_KEY", "AK")
    monkeypatch.setenv("SHIPYARD_SERVER_SECRET_KEY", "SK")
    assert credentials.load(str(tmp_path / "a")) == ("AK", "SK")


def test_a_shared_directory_is_refused_and_left_alone(tmp_path):
    import pytest

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    with pytest.raises(ValueError, match="directory of your own"):
        Home(str(shared)).ensure_private()
    assert mode(shared) == 0o1777


def test_a_directory_shipyard_did_not_make_is_not_walked(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("x")
    os.chmod(mine, 0o644)
    Home(str(tmp_path)).ensure_private()
    assert mode(tmp_path) == 0o700 and mode(mine) == 0o644
