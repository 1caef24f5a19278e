"""The serving worker's HTTP/1.1 front end (uvicorn + front_end.py's limits) over real
loopback sockets, with a small handler: keep-alive and pipelining in order, chunked
bodies, Expect: 100-continue (in order when pipelined), HEAD, the body limit (413 while
the body arrives, readable by a client still sending), malformed requests (400 after the
answers before them), a failing handler, HTTP/1.0, idle connections, a graceful stop,
head and body deadlines (slowloris, 408), 431 for large heads and the connection cap
(503). Plain uvicorn fails six of these (the limits it lacks)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from shipyard.http import protocol
from shipyard.serving.front_end import FrontEnd
from shipyard.serving.http_types import HttpRequest, HttpResponse
from shipyard.serving.protocol import error_body

LIMIT = 1000


async def handler(req: HttpRequest) -> HttpResponse:
    if req.path == "/boom":
        raise RuntimeError("kaput")
    if req.path == "/slow":
        await asyncio.sleep(0.3)
    if req.path == "/slower":
        await asyncio.sleep(2.5)
    echo = {
        "method": req.method,
        "path": req.path,
        "query": req.query,
        "len": len(req.body),
        "body": req.body.decode("latin-1"),
        "ctype": req.header("content-type"),
    }
    return HttpResponse(200, json.dumps(echo).encode(), headers=[("X-Seen", "1")])


class Running:
    def __init__(
        self,
        keepalive: float = 75.0,
        read_timeout: float = 60.0,
        **limits: float,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.server = FrontEnd(
            handler,
            LIMIT,
            error_body,
            keepalive_timeout=keepalive,
            read_timeout=read_timeout,
            **limits,  # type: ignore[arg-type]
        )
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(self.sock), self.loop).result(5)

    def stop(self, grace: float = 5.0) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop).result(grace + 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def srv():
    running = Running()
    yield running
    running.stop()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def read_response(s: socket.socket, buf: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response off ``s`` (leftover bytes stay in ``buf``)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {bytes(buf)!r}")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    buf[:] = rest[length:]
    return status, headers, rest[:length]


def closed_by_peer(s: socket.socket, wait: float = 5.0) -> bool:
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def test_keep_alive_and_pipelined_requests_answered_in_order(srv):
    s, buf = connect(srv.port), bytearray()
    s.sendall(post("/slow", b"first"))  # the slow one first: answers must keep the order
    s.sendall(post("/a%20b?x=1", b"second") + b"GET /third HTTP/1.1\r\nHost: x\r\n\r\n")
    got = [read_response(s, buf) for _ in range(3)]
    assert [g[0] for g in got] == [200, 200, 200]
    bodies = [json.loads(g[2]) for g in got]
    assert [b["body"] for b in bodies] == ["first", "second", ""]
    assert bodies[1]["path"] == "/a b" and bodies[1]["query"] == "x=1"
    assert bodies[2]["method"] == "GET"
    assert got[0][1]["content-type"] == "application/json" and got[0][1]["x-seen"] == "1"
    assert "date" in got[0][1] and "connection" not in got[0][1]
    s.close()


def test_chunked_body_expect_continue_and_head(srv):
    s, buf = connect(srv.port), bytearray()
    s.sendall(
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    status, _, body = read_response(s, buf)
    assert status == 200 and json.loads(body)["body"] == "hello world"
    s.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
    status, _, _ = read_response(s, buf)
    assert status == 100
    s.sendall(b"abc")
    status, _, body = read_response(s, buf)
    assert status == 200 and json.loads(body)["body"] == "abc"
    s.sendall(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(65536)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: " in head.lower()
    assert head.endswith(b"\r\n\r\n")  # no body after a HEAD answer
    s.close()


def test_body_over_the_limit_is_refused_while_it_arrives(srv, monkeypatch):
    # the lingering close after each 413 (2 s in service) shortened: the test waits out two
    monkeypatch.setattr(protocol, "LINGER_SECONDS", 0.5)
    # announced: answered from the headers; a client that sends it all still reads the 413
    s, buf = connect(srv.port), bytearray()
    s.sendall(post("/big", b"x" * (LIMIT * 50)))
    status, headers, body = read_response(s, buf)
    assert status == 413 and b"payload limit" in body and headers["connection"] == "close"
    assert closed_by_peer(s)
    # chunked, so unannounced: refused once the limit is crossed
    s, buf = connect(srv.port), bytearray()
    s.sendall(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(3):
        s.sendall(b"200\r\n" + b"y" * 512 + b"\r\n")
    status, _, body = read_response(s, buf)
    assert status == 413 and b"payload limit" in body
    # with Expect: 100-continue the body is never asked for
    s, buf = connect(srv.port), bytearray()
    s.sendall(
        post("/big", b"", "Expect: 100-continue\r\n").replace(
            b"Content-Length: 0", f"Content-Length: {LIMIT + 1}".encode()
        )
    )
    status, _, _ = read_response(s, buf)
    assert status == 413 and closed_by_peer(s)
    # the server still serves
    s, buf = connect(srv.port), bytearray()
    s.sendall(post("/ok", b"fine"))
    assert read_response(s, buf)[0] == 200


def test_malformed_request_failing_handler_and_http10(srv):
    s, buf = connect(srv.port), bytearray()
    s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    status, _, body = read_response(s, buf)
    assert status == 400 and b"malformed HTTP request" in body and closed_by_peer(s)
    # pipelined behind a request still being answered: the 400 waits for that answer
    s, buf = connect(srv.port), bytearray()
    s.sendall(post("/slow", b"first") + b"NOT HTTP AT ALL\r\n\r\n")
    status, _, body = read_response(s, buf)
    assert status == 200 and json.loads(body)["body"] == "first"
    assert read_response(s, buf)[0] == 400 and closed_by_peer(s)
    s, buf = connect(srv.port), bytearray()
    s.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = read_response(s, buf)
    assert status == 500 and json.loads(body) == {"error": "internal error: RuntimeError: kaput"}
    s.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")  # same connection, still served
    assert read_response(s, buf)[0] == 200
    s, buf = connect(srv.port), bytearray()
    s.sendall(b"GET /old HTTP/1.0\r\n\r\n")
    status, headers, _ = read_response(s, buf)
    assert status == 200 and headers["connection"] == "close" and closed_by_peer(s)


def test_idle_connections_are_closed_and_stop_lets_requests_finish():
    running = Running(keepalive=0.3, read_timeout=0.5)
    try:
        half, buf = connect(running.port), bytearray()
        half.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")  # and silence
        slow = connect(running.port)
        slow.sendall(post("/slower", b"busy, not stalled"))  # 2.5 s in its handler: kept
        assert closed_by_peer(half, wait=5)  # read_timeout is 0.5 s; 5 s is the hang guard
        assert read_response(slow, bytearray())[0] == 200
        s, buf = connect(running.port), bytearray()
        s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s, buf)[0] == 200
        assert closed_by_peer(s, wait=5)  # keepalive is 0.3 s; 5 s is the hang guard
        busy, buf = connect(running.port), bytearray()
        busy.sendall(post("/slow", b"in flight"))
        time.sleep(0.1)
    finally:
        running.stop(grace=5)
    status, _, body = read_response(busy, buf)  # answered before the connection closed
    assert status == 200 and json.loads(body)["body"] == "in flight"
    assert closed_by_peer(busy)


def test_pipelined_expect_continue_waits_for_the_answer_before_it(srv):
    # the 100 Continue of the second request must not overtake the first one's answer
    s, buf = connect(srv.port), bytearray()
    s.sendall(
        post("/slow", b"first")
        + b"POST /second HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        + b"Expect: 100-continue\r\n\r\n"
    )
    status, _, body = read_response(s, buf)
    assert status == 200 and json.loads(body)["body"] == "first"
    assert read_response(s, buf)[0] == 100
    s.sendall(b"abc")
    status, _, body = read_response(s, buf)
    assert status == 200 and json.loads(body)["body"] == "abc"
    s.close()


def test_a_head_over_the_limit_is_431(srv):
    s, buf = connect(srv.port), bytearray()
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    status, headers, body = read_response(s, buf)
    assert status == 431 and b"over 65536 bytes" in body and headers["connection"] == "close"
    assert closed_by_peer(s)
    # a header value that never ends, sent piece by piece, is cut off at the limit too
    s, buf = connect(srv.port), bytearray()
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Endless: ")
    try:
        for _ in range(200):
            s.sendall(b"b" * 1000)
            time.sleep(0.001)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert read_response(s, buf)[0] == 431
    # a long request line as well
    s, buf = connect(srv.port), bytearray()
    s.sendall(b"GET /" + b"u" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s, buf)[0] == 431


def trickle(s: socket.socket) -> bytes:
    """Send a byte every 0.2 s until the server answers (and what it answered)."""
    s.setblocking(False)
    answered = b""
    for _ in range(100):  # hang guard: 20 s
        try:
            s.sendall(b"X")
            time.sleep(0.2)
            answered += s.recv(65536)
        except BlockingIOError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        if answered.endswith(b"}"):
            break
    s.setblocking(True)
    return answered


def test_a_head_trickling_in_is_cut_off_at_its_deadline():
    """Slowloris: a header byte every 0.2 s keeps ``read_timeout`` from ever firing; the
    head's own deadline (1 s here) ends it with 408."""
    running = Running(read_timeout=60.0, head_timeout=1.0)
    try:
        s = connect(running.port)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        answered = trickle(s)
        assert answered.startswith(b"HTTP/1.1 408 ") and b"not complete within 1 s" in answered
        assert closed_by_peer(s)
        # a request sent at once on another connection is served as before
        s2, buf = connect(running.port), bytearray()
        s2.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s2, buf)[0] == 200
    finally:
        running.stop()


def test_a_body_trickling_in_is_cut_off_at_its_deadline():
    """The same for a body: a byte every 0.2 s keeps ``read_timeout`` from firing; the
    body's deadline (1 s from the end of its head here) ends it with 408."""
    running = Running(read_timeout=60.0, body_timeout=1.0)
    try:
        s = connect(running.port)
        s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n")
        answered = trickle(s)
        assert answered.startswith(b"HTTP/1.1 408 ")
        assert b"request body not complete within 1 s" in answered
        assert closed_by_peer(s)
    finally:
        running.stop()


def test_connections_over_the_cap_get_503_and_are_closed():
    running = Running(max_connections=3)
    try:
        held = []
        for _ in range(3):
            c, buf = connect(running.port), bytearray()
            c.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(c, buf)[0] == 200
            held.append(c)
        extra, buf = connect(running.port), bytearray()
        status, headers, body = read_response(extra, buf)
        assert status == 503 and b"3 connections open" in body
        assert headers["connection"] == "close" and closed_by_peer(extra)
        held.pop().close()
        for _ in range(50):  # until the server has seen the close (hang guard 5 s)
            again, buf = connect(running.port), bytearray()
            again.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            status = read_response(again, buf)[0]
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200
    finally:
        running.stop()
