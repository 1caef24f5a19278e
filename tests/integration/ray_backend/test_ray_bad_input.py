"""Bad input on the Ray backend: refused at submission, quickly, saying what to do, and
leaving nothing behind (no job recorded, no job dir, nothing started)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import shipyard
from shipyard.errors import ValidationError


def refused(session, write_script, match, error=ValidationError, **kw):
    src = write_script("train.py", "print('never runs')\n")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        session=session,
        **{"instance_count": 2, "instance_type": "local", **kw},
    )
    with pytest.raises(error, match=match):
        est.fit(job_name="refused")
    assert not session.control.store.exists("refused")
    assert not os.path.exists(os.path.join(session.home, "jobs", "refused"))


def test_an_address_with_no_cluster_is_refused_within_seconds(home, write_script):
    session = shipyard.Session(backend="ray", address="127.0.0.1:1", home=str(home))
    t0 = time.monotonic()
    refused(session, write_script, r"no Ray cluster answers at '127.0.0.1:1'.*ray start --head")
    assert time.monotonic() - t0 < 120  # hang guard; the probe itself waits 5 s


def test_ray_not_installed_names_the_extra(home):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import shipyard\n"
        "try:\n    shipyard.Session(backend='ray')\n"
        "except ValueError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=dict(os.environ, SHIPYARD_HOME=str(home)),
    )
    assert "pip install 'shipyard[ray]'" in out.stdout, out.stderr


def test_cli_backend_ray_with_a_dead_address_exits_2(home, write_script):
    src = write_script("train.py", "print('never runs')\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "shipyard.cli",
            "train",
            "train.py",
            "--source-dir",
            src,
            "--backend",
            "ray",
            "--ray-address",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, SHIPYARD_HOME=str(home)),
    )
    assert out.returncode == 2, out.stderr
    assert "no Ray cluster answers" in out.stderr
