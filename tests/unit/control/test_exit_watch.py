"""The attempt's wait woken by an instance's exit (control.exits), not by a timer.

Real child processes (``sleep``) stand for the local backend's agents. Each wait is given
a timeout far longer than the test may take, so a wait that only sleeps fails as a hang
guard would, not as a measured duration."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from shipyard.backends.api import InstanceHandle, LaunchSpec
from shipyard.backends.inprocess import InProcessBackend, Script
from shipyard.control.exits import ExitWatch, child_pidfd

pytestmark = pytest.mark.skipif(
    not hasattr(os, "pidfd_open") or not sys.platform.startswith("linux"),
    reason="pidfds are Linux's (5.3+)",
)

LONG = 120.0  # a wait that is not woken by the exit takes this long: the test hangs


def _child(seconds: float) -> subprocess.Popen:
    return subprocess.Popen(["sleep", str(seconds)])


def _handle(host: str, pid: int) -> InstanceHandle:
    return InstanceHandle(host, pid, "/dev/null")


def test_a_childs_exit_wakes_the_wait_before_its_timeout() -> None:
    proc = _child(0.05)
    try:
        with ExitWatch([_handle("algo-1", proc.pid)]) as watch:
            assert watch.watched == {"algo-1"}
            result: dict[str, set[str]] = {}
            waiter = threading.Thread(
                target=lambda: result.update(woke=watch.wait(LONG, ["algo-1"])), daemon=True
            )
            waiter.start()
            waiter.join(30)  # hang guard, far above a sleep of 0.05 s
            assert not waiter.is_alive(), "the wait was not woken by the child's exit"
            assert result["woke"] == {"algo-1"}
            assert proc.poll() == 0  # the exit is still the backend's to collect
    finally:
        proc.kill()
        proc.wait()


def test_only_the_exited_host_is_reported_among_several() -> None:
    quick, slow = _child(0.05), _child(60)
    try:
        handles = [_handle("algo-1", quick.pid), _handle("algo-2", slow.pid)]
        with ExitWatch(handles) as watch:
            assert watch.covers(["algo-1", "algo-2"])
            quick.wait()  # reaped: its pidfd stays readable
            assert watch.wait(LONG, ["algo-1", "algo-2"]) == {"algo-1"}
            watch.forget("algo-1")
            assert watch.wait(0.01, ["algo-2"]) == set()  # the timeout, nothing exited
    finally:
        slow.kill()
        slow.wait()


def test_a_process_not_ours_is_not_watched() -> None:
    """Ray's pids are a remote node's, the in-process backend's a counter: a pid that is
    not a child of this process must not be taken for the instance."""
    assert child_pidfd(os.getpid()) is None  # this process: no child of itself
    assert child_pidfd(1) is None  # init: someone else's
    assert child_pidfd(0) is None
    assert child_pidfd(-5) is None
    with ExitWatch([_handle("algo-1", 1)]) as watch:
        assert watch.watched == set()
        assert not watch.covers(["algo-1"])
        assert watch.wait(0.01, ["algo-1"]) == set()  # a plain timed wait


def test_close_frees_the_descriptors() -> None:
    proc = _child(60)
    try:
        watch = ExitWatch([_handle("algo-1", proc.pid)])
        fd = watch._fds["algo-1"]
        watch.close()
        assert watch.watched == set()
        with pytest.raises(OSError):
            os.fstat(fd)
    finally:
        proc.kill()
        proc.wait()


class _ExitedTooEarly(InProcessBackend):
    """Each instance's handle names a real child that exits at once, while the backend
    says the instance runs for its script's seconds: a pidfd that is readable for good
    while the instance is still running (what a handle's pid that is not the instance's
    process would give). Counts the supervisor's looks."""

    def __init__(self, scripts: dict[str, Script]) -> None:
        super().__init__(scripts)
        self.polls = 0
        self.children: list[subprocess.Popen] = []

    def launch(self, specs: list[LaunchSpec]) -> list[InstanceHandle]:
        handles = super().launch(specs)
        out = []
        for handle in handles:
            child = subprocess.Popen(["true"])
            self.children.append(child)
            self._instances[child.pid] = self._instances.pop(handle.pid)
            out.append(InstanceHandle(handle.host, child.pid, handle.log_path))
        return out

    def poll(self, handle: InstanceHandle) -> int | None:
        self.polls += 1
        return super().poll(handle)


def test_a_pidfd_that_wakes_for_a_running_instance_does_not_spin_the_loop(make_job) -> None:
    job = make_job(hosts=2)
    seconds = 0.3
    backend = _ExitedTooEarly(
        {"algo-1": Script(seconds=seconds), "algo-2": Script(seconds=seconds)}
    )
    try:
        record = job.supervisor(backend).run()
    finally:
        for child in backend.children:
            child.wait()
    assert str(record.status) == "Completed"
    # a look per 20 ms at most once the false wake is dropped (~30 here); a loop that
    # kept waiting on the readable fd would look thousands of times in 0.3 s
    assert backend.polls < 400, backend.polls
