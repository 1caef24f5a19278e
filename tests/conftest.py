"""Shared fixtures: every test gets its own SHIPYARD_HOME, and helpers to find processes."""

from __future__ import annotations

import os
import textwrap

import psutil
import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    path = tmp_path / "shipyard-home"
    monkeypatch.setenv("SHIPYARD_HOME", str(path))
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return path


@pytest.fixture
def session(home):
    import shipyard

    return shipyard.Session(home=str(home))


@pytest.fixture
def write_script(tmp_path):
    """write_script(name, body) -> source_dir containing the dedented script."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)

    def _write(name: str, body: str) -> str:
        (src / name).write_text(textwrap.dedent(body))
        return str(src)

    return _write


def job_processes(job_dir: str) -> list[psutil.Process]:
    """Processes that belong to a job: started from its tree or configured by it."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        if proc.pid == os.getpid():
            continue
        try:
            info = proc.info
            cmd = " ".join(info.get("cmdline") or [])
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if (
            job_dir in cmd
            or job_dir in (info.get("cwd") or "")
            or job_dir in env.get("SAGEMAKER_BASE_DIR", "")
            or job_dir in env.get("SHIPYARD_INSTANCE_DIR", "")
        ):
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def host_listeners(job_dir: str) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket a job's processes listen on in this
    machine's own network namespace: none when the job runs in instance sandboxes (its
    sockets live in the instances' namespaces, and pasta forwards nothing in)."""
    mine = os.readlink("/proc/self/ns/net")
    found = []
    for proc in job_processes(job_dir):
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/net") != mine:
                continue
            conns = proc.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            continue
        found += [
            (proc.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN
        ]
    return found
