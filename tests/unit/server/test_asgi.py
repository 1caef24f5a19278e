"""server/asgi.py over real sockets, with a small handler at its seam (``Handler``): the
head deadline, a stalled body, an idle connection, the connection cap, a large upload
read as it arrives (the client is held back, never buffered whole), file answers, and a
handler's bug answered 500 with the server still serving."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
import time

import pytest

from shipyard.server import asgi
from shipyard.server.http import Request, Response

pytest.importorskip("httptools")

GUARD = 20.0  # hang guard for every wait below: generous, never the thing measured


class Handler:
    """Echo-ish: ``/upload`` reads its body in 1 MiB pieces (``/held`` waits after the
    first until released), ``/file`` answers a file, ``/boom`` raises."""

    def __init__(self, tmp: str) -> None:
        self.file = os.path.join(tmp, "blob")
        with open(self.file, "wb") as fh:
            fh.write(os.urandom(3 << 20))
        self.release = threading.Event()
        self.first_read = threading.Event()
        self.seen: list[tuple[str, int, str]] = []  # (path, bytes read, sha256)

    def handle(self, req: Request) -> Response:
        if req.raw_path in ("/upload", "/held"):
            digest, size = hashlib.sha256(), 0
            while True:
                piece = req.stream.read(1 << 20)
                if not piece:
                    break
                digest.update(piece)
                size += len(piece)
                if req.raw_path == "/held" and not self.first_read.is_set():
                    self.first_read.set()
                    self.release.wait(GUARD)
            self.seen.append((req.raw_path, size, digest.hexdigest()))
            return Response(200, f"{size} {digest.hexdigest()}".encode())
        if req.raw_path == "/file":
            size = os.path.getsize(self.file)
            return Response(
                200, file=self.file, offset=0, length=size, headers={"Content-Length": str(size)}
            )
        if req.raw_path == "/boom":
            raise RuntimeError("a bug")
        return Response(200, b"ok " + req.body)

    def error_for(self, req: Request, status: int, code: str, message: str) -> Response:
        return Response(status, f"{code}: {message}".encode())


class Running:
    def __init__(self, handler: Handler, limits: asgi.Limits, pools: asgi.Pools) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = asgi.Server(handler, limits, pools)
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(self.sock)), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + GUARD
        while not self.server.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)

    def connect(self) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port), timeout=GUARD)
        return conn

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(GUARD)
        self.sock.close()


@pytest.fixture
def serve(tmp_path):
    running: list[Running] = []

    def start(**limits) -> tuple[Running, Handler]:
        handler = Handler(str(tmp_path))
        names = ("threads", "upload_threads", "backlog", "shutdown_grace")
        pools = asgi.Pools(**{name: limits.pop(name) for name in names if name in limits})
        run = Running(handler, asgi.api_limits(**limits), pools)
        running.append(run)
        return run, handler

    yield start
    for run in running:
        run.stop()


def read_all(conn: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    out = b""
    while True:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def response(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = conn.recv(65536)
        assert chunk
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


def test_a_slow_head_is_408_then_closed(serve):
    run, _ = serve(head_timeout=1.0)
    conn = run.connect()
    conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    start = time.monotonic()
    answer = b""
    while time.monotonic() - start < GUARD:  # a header byte every 0.2 s: never complete
        try:
            conn.sendall(b"X")
        except OSError:
            break
        conn.settimeout(0.2)
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        answer += chunk
        if not chunk or b"\r\n\r\n" in answer:
            break
    assert answer.startswith(b"HTTP/1.1 408"), answer
    conn.settimeout(GUARD)
    read_all(conn)  # and the server closes it


def test_idle_connections_are_closed(serve):
    run, _ = serve(keepalive_timeout=1.0)
    conn = run.connect()
    assert read_all(conn) == b""  # closed by the server (the guard would raise instead)
    used = run.connect()  # and one idle after an answer
    used.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response(used)[0] == 200
    assert read_all(used) == b""


def test_a_stalled_body_closes_the_connection_and_the_server_serves_on(serve):
    run, handler = serve(read_timeout=1.0)
    conn = run.connect()
    conn.sendall(b"PUT /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n")
    conn.sendall(b"a" * 100_000)  # then nothing more
    read_all(conn)
    deadline = time.monotonic() + GUARD
    while not handler.seen:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert handler.seen[0][:2] == ("/upload", 100_000)  # the handler saw a short body
    fresh = run.connect()
    fresh.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
    assert response(fresh)[::2] == (200, b"ok hi")


def test_connections_over_the_cap_are_refused_at_once(serve):
    run, _ = serve(max_connections=3)
    held = [run.connect() for _ in range(3)]
    for conn in held:  # each answered, then kept open
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert response(conn)[0] == 200
    extra = run.connect()
    assert read_all(extra).startswith(b"HTTP/1.1 503")
    held[0].close()
    time.sleep(0.2)
    again = run.connect()
    again.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response(again)[0] == 200


def test_a_large_upload_is_read_as_it_arrives_never_buffered_whole(serve):
    run, handler = serve()
    size = 64 << 20
    conn = run.connect()
    conn.sendall(b"PUT /held HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
    payload = os.urandom(1 << 20) * 64
    conn.setblocking(False)
    sent = 0
    idle_since = time.monotonic()
    while sent < size and time.monotonic() - idle_since < 1.0:  # until the server holds us
        try:
            n = conn.send(payload[sent : sent + (1 << 20)])
        except BlockingIOError:
            time.sleep(0.01)
            continue
        sent += n
        idle_since = time.monotonic()
    assert handler.first_read.is_set()
    assert sent < size // 2, f"the server took {sent} of {size} bytes while its handler waited"
    handler.release.set()
    conn.setblocking(True)
    conn.sendall(payload[sent:])
    status, _, body = response(conn)
    assert status == 200
    assert body.decode() == f"{size} {hashlib.sha256(payload).hexdigest()}"


def test_file_answers_and_head(serve):
    run, handler = serve()
    conn = run.connect()
    conn.sendall(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = response(conn)
    with open(handler.file, "rb") as fh:
        assert (status, body) == (200, fh.read())
    conn.sendall(b"HEAD /file HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.settimeout(2)
    data = conn.recv(65536)
    assert data.startswith(b"HTTP/1.1 200") and b"content-length: 3145728" in data.lower()
    assert data.endswith(b"\r\n\r\n")  # no body after a HEAD's headers


def test_a_handler_bug_is_a_500_and_the_server_serves_on(serve):
    run, _ = serve()
    conn = run.connect()
    conn.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = response(conn)
    assert status == 500 and b"a bug" in body
    conn.sendall(b"GET /_shipyard/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response(conn)[0] == 200


def test_an_upload_in_progress_never_takes_the_api_threads(serve):
    run, handler = serve(threads=1, upload_threads=1)
    upload = run.connect()
    upload.sendall(b"PUT /held HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (4 << 20))
    upload.sendall(b"a" * (2 << 20))
    assert handler.first_read.wait(GUARD)  # the upload's handler holds its thread
    call = run.connect()
    call.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
    call.settimeout(GUARD)
    assert response(call)[::2] == (200, b"ok hi")
    handler.release.set()
    upload.sendall(b"a" * (2 << 20))
    assert response(upload)[0] == 200


def test_a_head_over_the_size_cap_is_431_then_closed(serve):
    run, _ = serve(max_head=16 << 10)
    conn = run.connect()
    conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
    try:
        for _ in range(64):  # 64 KiB of one header that never ends
            conn.sendall(b"a" * 1024)
    except OSError:
        pass  # the server may close before the rest is sent
    assert read_all(conn).startswith(b"HTTP/1.1 431")
