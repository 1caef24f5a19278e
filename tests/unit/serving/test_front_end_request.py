"""The request the front end builds in uvicorn's parser callbacks and the answer it frames
itself (no ASGI cycle in between), over real sockets: what the handler sees of the URL and
headers, and what an answer the handler should not have given turns into."""

from __future__ import annotations

import json
import socket

import pytest

from shipyard.serving.http_types import HttpRequest, HttpResponse
from tests.unit.serving.test_front_end import Running, closed_by_peer, connect, read_response


async def seen(req: HttpRequest) -> HttpResponse:
    if req.path == "/inject":  # a header value a script could build from its input
        return HttpResponse(200, b"{}", headers=[("X-Echo", "a\r\nSet-Cookie: x=1")])
    if req.path == "/close":
        return HttpResponse(200, b"{}", headers=[("Connection", "close")])
    echo = {"method": req.method, "path": req.path, "query": req.query, "headers": req.headers}
    return HttpResponse(200, json.dumps(echo).encode(), content_type="application/json")


@pytest.fixture
def srv(monkeypatch):
    import tests.unit.serving.test_front_end as conformance

    monkeypatch.setattr(conformance, "handler", seen)
    running = Running()
    yield running
    running.stop()


def ask(s: socket.socket, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    s.sendall(raw)
    return read_response(s, bytearray())


def test_url_forms_and_headers_reach_the_handler(srv):
    s = connect(srv.port)
    status, _, body = ask(
        s,
        b"GET /a%20b/c?x=1&y=%20 HTTP/1.1\r\nHost: x\r\nX-Twice: 1\r\nx-twice: 2\r\n"
        b"Accept: text/csv\r\n\r\n",
    )
    got = json.loads(body)
    assert status == 200
    assert (got["method"], got["path"], got["query"]) == ("GET", "/a b/c", "x=1&y=%20")
    assert got["headers"]["x-twice"] == "2" and got["headers"]["accept"] == "text/csv"
    # absolute form (a proxy's), and a fragment: the parser's URL rules decide
    _, _, body = ask(s, b"GET http://h:1/p/q?z=3 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (json.loads(body)["path"], json.loads(body)["query"]) == ("/p/q", "z=3")
    _, _, body = ask(s, b"GET /f?k=v#frag HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (json.loads(body)["path"], json.loads(body)["query"]) == ("/f", "k=v")
    s.close()


def test_a_raw_non_ascii_path_and_an_upgrade_are_400(srv):
    s = connect(srv.port)
    status, _, body = ask(s, "GET /caf\u00e9 HTTP/1.1\r\nHost: x\r\n\r\n".encode("latin-1"))
    assert status == 400 and b"malformed" in body
    assert closed_by_peer(s)
    s = connect(srv.port)
    status, _, body = ask(
        s,
        b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    assert status == 400 and b"upgrades are not supported" in body
    assert closed_by_peer(s)


def test_an_injected_header_is_a_500_and_connection_close_is_honoured(srv):
    s = connect(srv.port)
    status, headers, body = ask(s, b"GET /inject HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 500 and "set-cookie" not in headers
    assert b"internal error" in body
    status, headers, _ = ask(s, b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and headers["connection"] == "close"
    assert closed_by_peer(s)


def test_head_has_the_length_and_no_body(srv):
    s = connect(srv.port)
    s.sendall(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\nGET /y HTTP/1.1\r\nHost: x\r\n\r\n")
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: " in head
    buf[:] = rest
    status, _, body = read_response(s, buf)  # the next answer follows the head at once
    assert status == 200 and json.loads(body)["path"] == "/y"
    s.close()
