"""``shipyard.mpi.launch`` ends with mpirun even where mpirun does not (CI saw a 4-rank job
hang for 120 s after a rank's MPI_ABORT: mpirun printed the abort and never exited)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
import time

import pytest

from shipyard.mpi import launch as mpi_launch

ABORT_BANNER = (
    "-" * 74 + "\nMPI_ABORT was invoked on rank 3 in communicator MPI COMM 5 DUP FROM 0\n"
    "  Errorcode: 1\n" + "-" * 74 + "\n"
)


def _fake_mpirun(tmp_path, body: str) -> list[str]:
    script = tmp_path / "mpirun.py"
    script.write_text(textwrap.dedent(body))
    return [sys.executable, str(script)]


@pytest.mark.timeout(60)
def test_mpirun_that_hangs_after_an_abort_is_stopped_after_the_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(mpi_launch, "ABORT_GRACE_S", 1.0)
    pid_file = tmp_path / "pid"
    command = _fake_mpirun(
        tmp_path,
        f"""
        import os, sys, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        sys.stderr.write({ABORT_BANNER!r}); sys.stderr.flush()
        time.sleep(3600)
        """,
    )
    failure = tmp_path / "failure.txt"
    started = time.monotonic()
    code = mpi_launch.launch(command, str(failure))
    assert code != 0
    assert time.monotonic() - started < 50  # a hang guard: the grace is 1 s here
    assert "MPI_ABORT was invoked on rank 3" in failure.read_text()
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.timeout(60)
def test_mpirun_gone_while_its_child_holds_the_pipe_ends_the_launch(tmp_path, monkeypatch):
    monkeypatch.setattr(mpi_launch, "DRAIN_S", 0.5)
    child_pid = tmp_path / "child.pid"
    command = _fake_mpirun(
        tmp_path,
        f"""
        import subprocess, sys
        # a child that outlives mpirun with mpirun's stderr (an rsh client, a daemon)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(child_pid)!r}, "w").write(str(child.pid))
        sys.stderr.write("mpirun: exiting\\n"); sys.stderr.flush()
        sys.exit(3)
        """,
    )
    try:
        assert mpi_launch.launch(command, str(tmp_path / "failure.txt")) == 3
    finally:
        if child_pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child_pid.read_text()), signal.SIGKILL)


def test_an_abort_mpirun_ends_itself_is_not_signalled(tmp_path, monkeypatch):
    monkeypatch.setattr(mpi_launch, "ABORT_GRACE_S", 30.0)
    command = _fake_mpirun(
        tmp_path,
        f"""
        import sys
        sys.stderr.write({ABORT_BANNER!r}); sys.stderr.flush()
        sys.exit(1)
        """,
    )
    assert mpi_launch.launch(command, str(tmp_path / "failure.txt")) == 1


@pytest.mark.timeout(60)
def test_a_rank_that_prints_the_words_does_not_start_the_grace(tmp_path, monkeypatch):
    """A script's own output (tagged by its rank's wrapper) may say anything."""
    monkeypatch.setattr(mpi_launch, "ABORT_GRACE_S", 0.5)
    command = _fake_mpirun(
        tmp_path,
        """
        import sys, time
        sys.stderr.write("[algo-1 rank 0] MPI_ABORT was invoked, says my log\\n")
        sys.stderr.flush()
        time.sleep(2)
        """,
    )
    assert mpi_launch.launch(command, str(tmp_path / "failure.txt")) == 0
