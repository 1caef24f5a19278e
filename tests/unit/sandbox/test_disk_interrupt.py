"""A Ctrl-C while an instance's disks are being made leaves none mounted: the disks the
threads finished are released before the interrupt goes on (seen once in the suite: a
Ctrl-C'd job at its first launch left its two disks mounted, issue 37)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from shipyard.sandbox import disk


class _InterruptedPool(ThreadPoolExecutor):
    """Ctrl-C landing in the waiting thread once the first disk is made (as the signal
    would: only the thread that waits on the pool sees it; the others go on)."""

    def map(self, fn, *iterables, **kwargs):  # type: ignore[override]
        results = super().map(fn, *iterables, **kwargs)

        def interrupted():
            yield next(results)
            raise KeyboardInterrupt

        return interrupted()


def test_an_interrupt_while_the_disks_are_made_releases_those_made(monkeypatch, tmp_path):
    job_dir = str(tmp_path)
    hosts = ["algo-1", "algo-2", "algo-3"]
    made_by: list[str] = []

    def create(job_dir: str, host: str, size_gb: int, instances: int = 1) -> disk.Disk:
        made_by.append(threading.current_thread().name)
        return disk.Disk(host, f"{job_dir}/instances/{host}", f"{job_dir}/disks/{host}.img", 1, 1)

    released: list[list[str]] = []
    monkeypatch.setattr(disk, "missing_reason", lambda: None)
    monkeypatch.setattr(disk, "create", create)
    monkeypatch.setattr(disk, "ThreadPoolExecutor", _InterruptedPool)
    monkeypatch.setattr(
        disk, "release_all", lambda disks, jd: released.append(sorted(d.host for d in disks))
    )
    with pytest.raises(KeyboardInterrupt):
        disk.create_all(job_dir, hosts, 1)
    assert len(made_by) == 3
    assert released == [hosts]  # all three were made (the pool's exit waited): all released


def test_without_an_interrupt_nothing_is_released(monkeypatch, tmp_path):
    def create(job_dir: str, host: str, size_gb: int, instances: int = 1) -> disk.Disk:
        if host == "algo-2":
            raise OSError("no loop device")
        return disk.Disk(host, "t", "i", 1, 1)

    monkeypatch.setattr(disk, "missing_reason", lambda: None)
    monkeypatch.setattr(disk, "create", create)
    monkeypatch.setattr(disk, "release_all", lambda *a: pytest.fail("released"))
    made = disk.create_all(str(tmp_path), ["algo-1", "algo-2"], 1)
    assert isinstance(made["algo-1"], disk.Disk)
    assert made["algo-2"] == "its disk could not be made: no loop device"
