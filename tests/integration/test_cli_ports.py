"""`shipyard server` and `shipyard ui` run side by side with their defaults (the README starts
both), and a busy port is one clear line, not `[Errno 98]` (issue 41)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

SHIPYARD = os.path.join(os.path.dirname(sys.executable), "shipyard")
pytestmark = pytest.mark.timeout(120)


def _answers(url: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer")


def test_server_and_ui_run_side_by_side_with_their_defaults(tmp_path):
    from shipyard.cli.observe import DASHBOARD_PORT
    from shipyard.observe.tensorboard import port_free
    from shipyard.server.env import DEFAULT_PORT

    if not (port_free("127.0.0.1", DEFAULT_PORT) and port_free("127.0.0.1", DASHBOARD_PORT)):
        pytest.skip(f"port {DEFAULT_PORT} or {DASHBOARD_PORT} is taken on this machine")
    env = dict(os.environ, SHIPYARD_HOME=str(tmp_path / "home"))
    procs = [
        subprocess.Popen(
            [SHIPYARD, cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        for cmd in ("server", "ui")
    ]
    try:
        deadline = time.monotonic() + 60
        assert _answers(f"http://127.0.0.1:{DEFAULT_PORT}/_shipyard/health", deadline) == 200
        assert _answers(f"http://127.0.0.1:{DASHBOARD_PORT}/", deadline) == 200
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)


def test_a_busy_port_is_one_line_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, SHIPYARD_HOME=str(tmp_path / "home"))
        done = subprocess.run(
            [SHIPYARD, "server", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"error: port {port} on 127.0.0.1 is in use"), done.stderr
    assert "Errno" not in done.stderr and "Traceback" not in done.stderr
