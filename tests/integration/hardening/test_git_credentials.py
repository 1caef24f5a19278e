"""Issue 20, defect 10 (git part): a git_config token or password never appears on a
command line, in any process of the clone, or in the error; git gets it from an askpass
helper. Real git, real sockets.

Before the fix the token was put into the clone URL: ``git clone https://TOKEN@host/...``
was readable by any user in ps / /proc/*/cmdline (git-remote-https carried it too).
"""

from __future__ import annotations

import base64
import http.server
import socket
import threading

import psutil
import pytest

from shipyard.control.staging import git_clone
from shipyard.errors import ValidationError

TOKEN = "ghp_SECRETtoken1234567890"
PASSWORD = "pa55-w0rd-SECRET"


def _cmdlines_with(secret: str) -> list[str]:
    hits = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if secret in cmd:
            hits.append(cmd)
    return hits


def test_https_token_is_not_on_any_command_line(tmp_path):
    """A TLS peer that never answers holds git mid-clone while every process is read."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    seen: list[list[str]] = []

    def hold() -> None:
        conn, _ = srv.accept()
        seen.append(_cmdlines_with(TOKEN))
        conn.close()

    threading.Thread(target=hold, daemon=True).start()
    with pytest.raises(ValidationError) as err:
        git_clone(
            {"repo": f"https://127.0.0.1:{port}/org/repo.git", "token": TOKEN}, str(tmp_path / "c")
        )
    srv.close()
    assert seen, "git never connected"
    assert seen[0] == [], seen[0]
    assert TOKEN not in str(err.value)


def test_http_credentials_reach_the_server_through_askpass(tmp_path):
    """The helper really answers: git retries the 401 with user:password from it."""
    got: list[str] = []
    visible: list[list[str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            auth = self.headers.get("Authorization")
            visible.append(_cmdlines_with(PASSWORD))
            if not auth:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            got.append(base64.b64decode(auth.split()[1]).decode())
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ValidationError) as err:
            git_clone(
                {
                    "repo": f"http://127.0.0.1:{server.server_port}/org/repo.git",
                    "username": "alice",
                    "password": PASSWORD,
                },
                str(tmp_path / "c"),
            )
    finally:
        server.shutdown()
        server.server_close()
    assert got == [f"alice:{PASSWORD}"]
    assert all(v == [] for v in visible), visible
    assert PASSWORD not in str(err.value)
