"""One HTTP layer (issue 36): one module subclasses uvicorn's protocol, and every shipyard
server refuses with the same framing (its default headers, the body and content type its
``Limits`` make, ``connection: close``), over real loopback sockets: ``shipyard server``'s
ASGI mode and a model server worker's fast path, at the connection cap (503) and for a
head over its size (431)."""

from __future__ import annotations

import ast
import json
import pathlib
import socket
import tempfile
import time
from collections.abc import Iterator

import pytest

from shipyard.server import asgi
from tests.unit.server.test_asgi import GUARD, read_all
from tests.unit.server.test_asgi import Handler as ApiHandler
from tests.unit.server.test_asgi import Running as ApiRunning
from tests.unit.serving.test_front_end import Running as WorkerRunning
from tests.unit.sources import parsed

SRC = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard"
UVICORN_PROTOCOLS = {"HttpToolsProtocol", "H11Protocol"}


def test_one_module_subclasses_uvicorns_protocol() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                if bases & UVICORN_PROTOCOLS:
                    found.append(f"{path.relative_to(SRC)}:{node.name}")
    assert found == ["http/protocol.py:GuardedProtocol"]


@pytest.fixture(params=["shipyard server", "model server worker"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """(which, port) with a connection cap of 1 and a head limit of 1 KiB."""
    if request.param == "shipyard server":
        with tempfile.TemporaryDirectory() as tmp:
            limits = asgi.api_limits(max_connections=1, max_head=1024)
            api = ApiRunning(ApiHandler(tmp), limits, asgi.Pools(threads=2, upload_threads=1))
            try:
                yield request.param, api.port
            finally:
                api.stop()
    else:
        worker = WorkerRunning(max_connections=1, max_head=1024)
        try:
            yield request.param, worker.port
        finally:
            worker.stop()


def _answer(conn: socket.socket) -> tuple[str, dict[str, str], bytes]:
    data = read_all(conn)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return lines[0], headers, body


def _framing(server: str, status: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
    """The parts every refusal shares, whichever server wrote it."""
    assert headers["content-length"] == str(len(body))
    if server == "model server worker":
        assert headers["content-type"] == "application/json"
        message = json.loads(body)["error"]
    else:
        assert headers["content-type"] == "text/plain"
        message = body.decode()
    assert message
    return {
        "status": status,
        "server": headers.get("server", ""),
        "date": "yes" if headers.get("date") else "",
        "connection": headers.get("connection", ""),
    }


def test_every_server_refuses_past_its_connection_cap_the_same_way(
    server: tuple[str, int],
) -> None:
    which, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as first:
        first.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")  # the one allowed, in use
        first.recv(65536)
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as second:
            status, headers, body = _answer(second)
    assert _framing(which, status, headers, body) == {
        "status": "HTTP/1.1 503 Service Unavailable",
        "server": "shipyard",
        "date": "yes",
        "connection": "close",
    }
    assert b"1 connections open" in body


def test_every_server_answers_a_head_over_its_size_431_the_same_way(
    server: tuple[str, int],
) -> None:
    which, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as conn:
        conn.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: ")
        time.sleep(0.2)  # the head has begun: the rest arrives in later reads
        conn.sendall(b"a" * 4096)
        status, headers, body = _answer(conn)
    assert _framing(which, status, headers, body) == {
        "status": "HTTP/1.1 431 Request Header Fields Too Large",
        "server": "shipyard",
        "date": "yes",
        "connection": "close",
    }
    assert b"over 1024 bytes" in body
