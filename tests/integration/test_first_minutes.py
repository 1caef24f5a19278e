"""The first minutes of a new user, without a stumble (issue 30): ``make demo``/``make test``
wait for a busy package manager, then go on without the optional tools and say which;
the demo's own process shows no TensorFlow start-up noise.

(The doctor's advice and ``--help`` have their own tests: tests/unit/cli/test_doctor_advice.py,
tests/unit/cli/test_cli_help.py.)"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

from shipyard.observe.logs import is_noise

ROOT = pathlib.Path(__file__).resolve().parents[2]
APT_LISTS_LOCK = "/var/lib/apt/lists/lock"  # what `apt-get update` takes first
MISSING = "shipyard-no-such-tool:shipyard-no-such-package"  # a tool no machine has

needs_apt_as_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("apt-get") is None or shutil.which("make") is None,
    reason="the package-manager path runs as root with apt-get and make (elsewhere it only says what is missing)",
)


@contextlib.contextmanager
def package_manager_busy():
    """Hold apt's lock as another install would (apt locks with fcntl, as lockf does)."""
    with open(APT_LISTS_LOCK, "w") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX)  # waits while a real install holds it
        try:
            yield fh
        finally:
            fcntl.lockf(fh, fcntl.LOCK_UN)


def _make(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@needs_apt_as_root
def test_make_waits_for_a_busy_package_manager_then_goes_on_saying_which():
    with package_manager_busy():
        done = _make("sandbox-tools", f"SANDBOX_TOOLS={MISSING}", "APT_WAIT=4", timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said  # it was "Could not get lock" and make stopped
    assert "the package manager is busy" in said and "waiting up to 4 s" in said
    assert "going on without shipyard-no-such-package" in said
    assert "jobs run without instance sandboxes" in said


@pytest.mark.slow
@needs_apt_as_root
def test_make_goes_on_once_the_package_manager_is_free():
    with package_manager_busy() as lock:
        release = threading.Timer(3, lambda: fcntl.lockf(lock, fcntl.LOCK_UN))
        release.start()
        done = _make("sandbox-tools", f"SANDBOX_TOOLS={MISSING}", "APT_WAIT=120", timeout=600)
        release.join()
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "waiting up to 120 s" in said
    # it got the lock, and apt-get itself answered: no such package, so it goes on without
    assert "could not install shipyard-no-such-package: going on without them" in said


PROBE = """
import os, sys, tempfile
sys.path.insert(0, {examples!r})
sys.path.insert(0, {data!r})
import demo
from make_cifar_tfrecords import write
write(os.path.join(tempfile.mkdtemp(), "t.tfrecords"), 8, 1)
print("loaded:", sorted(m for m in ("tensorflow", "torch", "keras") if m in sys.modules))
"""


def test_the_demo_process_loads_no_framework_so_prints_no_start_up_noise():
    # the demo's own process only writes the TFRecords (by hand, make_cifar_tfrecords):
    # TensorFlow's start-up noise (absl's pre-init warning, the CUDA probe, oneDNN lines)
    # cannot reach the demo's console, and its 7-10 s import is not paid there
    code = PROBE.format(examples=str(ROOT / "examples"), data=str(ROOT / "examples" / "data"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout, done.stdout
    assert [line for line in done.stderr.splitlines() if is_noise(line)] == []
