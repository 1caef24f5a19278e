"""Stopping processes waits for them to end, not for someone else to reap them.

A process whose parent does not reap it at once (an orphan's new parent is init, which
here reaps every couple of seconds) stays a zombie: it has ended. ``psutil.wait_procs``
kept waiting for such a zombie until its timeout, and every job stop, endpoint delete
and instance teardown that had orphans waited with it."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from shipyard.runtime.reaping import wait_gone

# A parent that starts a child which exits at once, and never reaps it: the child stays
# a zombie for as long as this parent lives (the test's stand-in for a slow init).
NEGLECTFUL_PARENT = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os._exit(0)
print(pid, flush=True)
time.sleep(120)
"""


def test_a_zombie_someone_else_has_yet_to_reap_counts_as_gone():
    parent = subprocess.Popen(
        [sys.executable, "-c", NEGLECTFUL_PARENT], stdout=subprocess.PIPE, text=True
    )
    try:
        zombie = psutil.Process(int(parent.stdout.readline()))
        while zombie.status() != psutil.STATUS_ZOMBIE:
            pass
        # what the stops used to call: the ended process is still "alive" at its timeout
        _, alive = psutil.wait_procs([zombie], timeout=0.2)
        assert alive == [zombie]
        assert wait_gone([zombie], timeout=60) == []
    finally:
        parent.kill()
        parent.wait()


def test_own_children_are_reaped_and_running_ones_reported():
    done = subprocess.Popen(["true"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        done_proc, running_proc = psutil.Process(done.pid), psutil.Process(running.pid)
        # ended (a zombie of ours) before the short wait: on a loaded machine a child that
        # is still starting would be reported running, which is right, but not this test
        deadline = time.monotonic() + 60
        while done_proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert wait_gone([done_proc, running_proc], timeout=0.3) == [running_proc]
        assert not psutil.pid_exists(done.pid)  # reaped, not left a zombie
    finally:
        running.kill()
        running.wait()


def test_descendants_reads_proc_as_psutil_does():
    """The agent's teardown finds what is left of an instance from /proc and imports
    psutil only when something is (a no-op instance ends without its 20 ms)."""
    import os

    from shipyard.runtime.reaping import descendants

    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process().children(recursive=True)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        expected = {p.pid for p in psutil.Process().children(recursive=True)}
        assert child.pid in expected and len(expected) >= 2
        assert set(descendants(os.getpid())) == expected
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.wait()
