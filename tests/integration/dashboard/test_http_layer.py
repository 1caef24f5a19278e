"""``shipyard ui`` is served by the HTTP layer every shipyard server uses (issue 36): a
request head over 64 KiB is refused 431 with the layer's framing (uvicorn alone, as the
dashboard ran before, has no limit on a head and kept reading it)."""

from __future__ import annotations

import socket

from tests.integration.dashboard.test_dashboard import serve_ui

GUARD = 30.0  # hang guard on every read


def _until_closed(conn: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = conn.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return out
        if not chunk:
            return out
        out += chunk


def test_the_dashboard_answers_a_head_over_64_kib_431_and_closes(home) -> None:
    with serve_ui() as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as conn:
            conn.sendall(b"GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
            for _ in range(80):  # 80 KiB of one header that never ends
                try:
                    conn.sendall(b"a" * 1024)
                except (BrokenPipeError, ConnectionResetError):
                    break
            answer = _until_closed(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    assert lines[0] == "HTTP/1.1 431 Request Header Fields Too Large", answer[:300]
    assert headers["server"] == "shipyard" and headers["connection"] == "close"
    assert body == b"request line and headers are over 65536 bytes"
