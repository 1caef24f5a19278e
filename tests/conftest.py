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


# ---- parallel runs (`make test`: pytest-xdist, -n 2 --dist loadgroup) ------------------------
# A whole-package group: the Ray backend tests share one 3-node cluster (package-scoped
# fixture in tests/integration/ray_backend/conftest.py); split across workers, each worker
# would start a cluster of its own (3 raylets, ~25 s of CPU) and the two would fight for the
# 2 cores the cluster's placement tests count on.
PACKAGE_GROUPS = ("tests/integration/ray_backend/",)


def xdist_group_of(nodeid: str) -> str | None:
    """The worker group of a test under ``--dist loadgroup``: None (any worker, test by
    test) for the unit tier; one group per module for integration and e2e tests, so a
    module's shared setup (a server, a job run that several tests inspect, its
    module-scoped fixtures) is made once, on one worker; one group per package in
    PACKAGE_GROUPS."""
    path = nodeid.split("::", 1)[0]
    for package in PACKAGE_GROUPS:
        if path.startswith(package):
            return package.rstrip("/")
    if path.startswith(("tests/integration/", "tests/e2e/")):
        return path
    return None


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent when xdist is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with xdist_group_of's groups, given to the scheduler directly
    rather than as xdist_group marks: a mark renames every test it groups (``nodeid@group``),
    which makes the durations and failures hard to read and their ids not runnable."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an explicit xdist_group mark
                return super()._split_scope(nodeid)
            return xdist_group_of(nodeid) or nodeid

    return ModuleGroups(config, log)


# what the server tests' shape fixture counted on each worker (tests/integration/server/
# conftest.py hands it over in workeroutput), summed here on the controller
_SHAPES_FROM_WORKERS: dict[str, int] = {}


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent when xdist is not loaded
def pytest_testnodedown(node, error) -> None:
    from tests.integration.server.shapes import SHAPES_CHECKED

    for op, n in getattr(node, "workeroutput", {}).get(SHAPES_CHECKED, {}).items():
        _SHAPES_FROM_WORKERS[op] = _SHAPES_FROM_WORKERS.get(op, 0) + n


def pytest_terminal_summary(terminalreporter) -> None:
    if _SHAPES_FROM_WORKERS:
        from tests.integration.server.shapes import summary

        terminalreporter.write_line(summary(_SHAPES_FROM_WORKERS))
