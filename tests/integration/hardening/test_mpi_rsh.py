"""Issue 20, defect 4: the mpi-on-Ray launch server (shipyard.mpi.rsh) runs a shell command
for a network request, so it must be replay-proof, bounded and loud.

Real server process, real client process, real sockets. Before the fix: a recorded
request replayed on a new connection ran its command again; an announced 4 GiB frame and
a silent peer each held a server thread forever; refusals left no trace; the job secret
crossed the wire inside the plan.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

SECRET = "s3cret-job-key-" + "x" * 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def rsh_server(tmp_path):
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "env.json").write_text(json.dumps(dict(os.environ)))
    port = _free_port()
    spec = {
        "ip": "127.0.0.1",
        "port": port,
        "secret": SECRET,
        "agent_dir": str(agent_dir),
        "env_file": str(agent_dir / "env.json"),
        "instances_dir": str(tmp_path / "instances"),
        "failure_file": str(agent_dir / "failure"),
        "run_dir": str(agent_dir / "run"),
        "cwd": str(tmp_path),
        "auth_timeout": 1.0,
    }
    serve_file = tmp_path / "serve.json"
    serve_file.write_text(json.dumps(spec))
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shipyard.mpi.rsh", "--serve", str(serve_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the rsh server did not start")
    yield port, log_path, tmp_path
    proc.terminate()
    proc.wait(timeout=10)


def _plan(tmp_path, port: int) -> str:
    plan = {
        "rsh": {"port": port, "secret": SECRET, "self": "127.0.0.2"},
        "failure_file": str(tmp_path / "master-failure"),
        "hosts": ["algo-1", "algo-2"],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return str(path)


class RecordingProxy:
    """Forwards one connection to the server and keeps every byte the client sent."""

    def __init__(self, upstream: int) -> None:
        self.sent = bytearray()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.upstream = upstream
        threading.Thread(target=self._serve, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    self.sent += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _serve(self) -> None:
        client, _ = self.srv.accept()
        server = socket.create_connection(("127.0.0.1", self.upstream))
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()
        self._pump(client, server, True)


def _read_until_closed(sock: socket.socket, limit_s: float = 10.0) -> bytes:
    sock.settimeout(limit_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for more than {limit_s} s")
    except ConnectionResetError:
        pass
    return out


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_recorded_request_cannot_be_replayed(rsh_server):
    port, log_path, tmp_path = rsh_server
    marker = tmp_path / "marker"
    proxy = RecordingProxy(port)
    result = subprocess.run(
        [sys.executable, "-m", "shipyard.mpi.rsh", "--plan", _plan(tmp_path, proxy.port)]
        + ["127.0.0.1", f"echo ran >> {marker}; echo hello"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "hello" in result.stdout
    assert _lines(marker) == ["ran"]
    # the attacker replays the exact bytes on a fresh connection
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(bytes(proxy.sent))
        answer = _read_until_closed(sock)
    time.sleep(0.5)
    assert _lines(marker) == ["ran"], "the replayed request ran the command again"
    assert b"refused" in answer
    assert "refused a request from 127.0.0.1" in log_path.read_text()
    assert SECRET.encode() not in proxy.sent  # the secret never crosses the wire


def test_an_announced_4_gib_frame_is_refused_before_reading(rsh_server):
    port, log_path, _ = rsh_server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(struct.pack("!cI", b"m", 0xFFFFFFFF))
        _read_until_closed(sock)
    assert "at most" in log_path.read_text()


def test_a_silent_peer_is_dropped_after_the_auth_timeout(rsh_server):
    port, log_path, _ = rsh_server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        _read_until_closed(sock)
    assert "time limit" in log_path.read_text()


def test_a_bad_signature_is_refused_and_logged(rsh_server):
    port, log_path, tmp_path = rsh_server
    plan = json.loads(open(_plan(tmp_path, port)).read())
    plan["rsh"]["secret"] = "not-the-job-secret"
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    result = subprocess.run(
        [sys.executable, "-m", "shipyard.mpi.rsh", "--plan", str(tmp_path / "bad.json")]
        + ["127.0.0.1", f"touch {tmp_path / 'never'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 255
    assert "not signed with this job's secret" in result.stderr
    assert not (tmp_path / "never").exists()
    assert "not signed with this job's secret" in log_path.read_text()
