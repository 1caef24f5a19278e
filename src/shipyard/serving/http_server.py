"""HTTP/1.1 for a serving worker: an asyncio Protocol over httptools (the parser under
uvicorn), on uvloop when it is installed.

Why not a web framework: a worker's CPU per request is what bounds what dynamic batching
can deliver on a small machine, and the framework was most of it. Measured on the 2-core
dev machine with the C load generator at concurrency 8 (BENCHMARKS.md): an aiohttp echo
handler answers ~22k req/s, this protocol ~94k on asyncio's loop and ~114k on uvloop.
What it keeps of a framework is what the endpoints need: keep-alive and pipelined
requests answered in order (a ``100 Continue`` included: it waits for the answers
before it), chunked request bodies, HEAD for GET routes, a body limit enforced while the
body arrives (413 before it is all read, then a lingering close so the client still
reads the answer), a head limit (431, counted as the bytes arrive, so a header that never
ends cannot grow without bound), malformed requests answered 400, idle connections
closed, and a graceful stop that lets requests in flight finish.

Slow clients (slowloris): a request head must be complete within ``head_timeout`` of
its first byte however steadily it trickles in (408, then close), a request stalled
mid-body is closed after ``read_timeout`` without a byte, and a worker holds at most
``max_connections`` connections (one over the cap is answered 503 and closed at once).

The application is one coroutine ``handler(HttpRequest) -> HttpResponse``; it must turn
its own errors into responses (``app.py`` answers ``{"error": ...}``), and anything that
still escapes is a 500 with the exception's type and message only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from shipyard.serving.http_types import Handler, HttpRequest, HttpResponse

log = logging.getLogger("shipyard.serving")

KEEPALIVE_TIMEOUT = 75.0  # seconds an idle keep-alive connection is kept (aiohttp's default)
READ_TIMEOUT = 60.0  # seconds a half-received body may go without a byte
HEAD_TIMEOUT = 10.0  # seconds from a request's first byte to the end of its headers
MAX_CONNECTIONS = 1000  # open connections per worker (each costs a descriptor and buffers)
LINGER_SECONDS = 2.0  # after a 413, how long the rest of the body is read and dropped
LINGER_BYTES = 64 << 20  # ... and how much of it at most
MAX_HEADER_BYTES = 64 << 10  # request line + headers
SMALL_BODY = 64 << 10  # responses below this go out in one write with their headers


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools wraps it, the protocol answers 431."""


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS_LINES: dict[int, bytes] = {s.value: _status_line(s.value) for s in HTTPStatus}


class Server:
    """What the connections of one worker share: the handler, the limits, the clock
    for the Date header, and the open connections (for idle sweeps and a clean stop)."""

    def __init__(
        self,
        handler: Handler,
        max_body: int,
        error_body: Callable[[str], bytes],
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        max_head: int = MAX_HEADER_BYTES,
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        self.error_body = error_body
        self.keepalive_timeout = keepalive_timeout
        self.read_timeout = read_timeout
        self.head_timeout = head_timeout
        self.max_connections = max_connections
        self.max_head = max_head
        self.connections: set[HttpProtocol] = set()
        self.date = b""
        self._tick: asyncio.TimerHandle | None = None
        self._server: asyncio.AbstractServer | None = None

    def protocol(self) -> HttpProtocol:
        return HttpProtocol(self)

    async def start(self, sock: object, backlog: int = 1024) -> None:
        loop = asyncio.get_running_loop()
        self._refresh()
        self._server = await loop.create_server(self.protocol, sock=sock, backlog=backlog)

    def _refresh(self) -> None:
        """Once a second: the cached Date header; idle keep-alive connections closed, those
        whose head is not complete ``head_timeout`` after its first byte (a client
        trickling a header byte every few seconds would otherwise hold its connection
        forever), and those whose body stopped arriving halfway."""
        now = time.time()
        self.date = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        mono = time.monotonic()
        idle_since, stalled_since = mono - self.keepalive_timeout, mono - self.read_timeout
        head_since = mono - self.head_timeout
        for conn in list(self.connections):
            if conn.head_since is not None and conn.head_since < head_since:
                conn.head_timed_out()
            elif conn.idle_since is not None:
                if conn.idle_since < idle_since:
                    conn.close()
            elif not conn.busy and not conn.pending and conn.last_data < stalled_since:
                conn.close()
        self._tick = asyncio.get_running_loop().call_later(1.0, self._refresh)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let requests in flight finish (up to ``grace`` s), close."""
        if self._tick is not None:
            self._tick.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.closing = True
            if conn.idle_since is not None:
                conn.close()
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()


class HttpProtocol(asyncio.Protocol):
    """One connection. Requests are parsed as bytes arrive and answered strictly in
    order, one at a time (HTTP/1.1 pipelining)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        # requests to handle, answers to write, and 100 Continue (bytes), in arrival order
        self.pending: deque[HttpRequest | HttpResponse | bytes] = deque()
        self.busy = False  # a request of this connection is being handled
        self.closing = False  # close once the queued answers are written
        self.idle_since: float | None = time.monotonic()
        self.last_data = time.monotonic()  # when bytes last arrived
        self.head_since: float | None = None  # first byte of a head still incomplete
        self.discarding = 0  # > 0: bytes of a refused body still to drop (lingering close)
        self._url: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._head_len = 0
        self._refused = False
        self._keep_alive = True
        self._head_raw = 0  # bytes of whole reads that went to the current head
        self._begun = 0  # requests begun on this connection

    # -- transport events -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        if len(server.connections) >= server.max_connections:
            body = server.error_body(
                f"this worker has {server.max_connections} connections open, its limit; "
                "retry shortly or reuse a keep-alive connection"
            )
            self.closing = True
            self.pending.append(HttpResponse(503, body))
            self._next()
            return
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        self.last_data = time.monotonic()
        if self.discarding:
            self.discarding -= min(self.discarding, len(data))
            if not self.discarding:
                self.close()
            return
        begun = self._begun
        try:
            self.parser.feed_data(data)
            if self.head_since is not None and self._begun == begun:
                # the whole read went to one head that is still not complete: count it
                # here, as httptools keeps a header's pieces until the header ends
                self._head_raw += len(data)
                if self._head_raw > self.server.max_head:
                    raise _HeadTooLarge
        except httptools.HttpParserUpgrade:
            self._refuse_now(400, "protocol upgrades are not supported")
        except (httptools.HttpParserError, _HeadTooLarge) as exc:
            if self.discarding or self.closing:
                return
            if _HeadTooLarge in (type(exc), type(exc.__cause__), type(exc.__context__)):
                self.head_since = None
                self._refuse_now(
                    431,
                    f"request line and headers are over {self.server.max_head} bytes; "
                    "send large values in the body",
                )
            else:
                self._refuse_now(400, f"malformed HTTP request: {exc}")

    def head_timed_out(self) -> None:
        """The head took longer than ``head_timeout``: 408 after the answers before it,
        then close; nothing more is read from this client."""
        self.head_since = None
        if self.transport is not None:
            self.transport.pause_reading()
        self._refuse_now(408, f"request headers not complete within {self.server.head_timeout:g} s")

    def pause_writing(self) -> None:  # a client that does not read: stop reading from it
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- parser callbacks (httptools) ----------------------------------------------------
    def on_message_begin(self) -> None:
        self.idle_since = None
        self.head_since = self.last_data
        self._head_raw = 0
        self._begun += 1
        self._url = []
        self._headers = {}
        self._body = []
        self._body_len = 0
        self._head_len = 0
        self._refused = False

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._head_len += len(url)
        if self._head_len > self.server.max_head:
            raise _HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_len += len(name) + len(value)
        if self._head_len > self.server.max_head:
            raise _HeadTooLarge
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head_since = None
        length = self._headers.get("content-length")
        limit = self.server.max_body
        if length is not None and length.isdigit() and int(length) > limit:
            self._refused = True
            self._answer_early(
                413,
                f"body of {length} bytes is over the payload limit of "
                f"{limit} bytes (MaxPayloadInMB)",
                int(length),
            )
        elif self._headers.get("expect", "").lower() == "100-continue" and self.transport:
            if self.busy or self.pending:  # after the answers to the requests before it
                self.pending.append(_CONTINUE)
            else:
                self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_len += len(body)
        if self._body_len > self.server.max_body:  # chunked, or more than announced
            self._refused = True
            self._body = []
            self._answer_early(
                413,
                f"body is over the payload limit of {self.server.max_body} bytes (MaxPayloadInMB)",
                LINGER_BYTES,
            )
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._keep_alive = self.parser.should_keep_alive()
        url = b"".join(self._url)
        try:
            parsed = httptools.parse_url(url)
            path = unquote(parsed.path.decode("latin-1")) if parsed.path else "/"
            query = parsed.query.decode("latin-1") if parsed.query else ""
        except httptools.HttpParserInvalidURLError:
            self._queue(
                HttpResponse(400, self.server.error_body(f"malformed request target {url[:200]!r}"))
            )
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._queue(
            HttpRequest(
                self.parser.get_method().decode("latin-1"), path, query, self._headers, body
            )
        )
        if not self._keep_alive:
            self.closing = True

    # -- answering ----------------------------------------------------------------------
    def _refuse_now(self, status: int, message: str) -> None:
        """An unparseable request: answer after the ones before it, then close."""
        self.closing = True
        self._queue(HttpResponse(status, self.server.error_body(message)))

    def _answer_early(self, status: int, message: str, body_left: int) -> None:
        """Refuse a request from its headers; drop its body as it comes (up to
        LINGER_BYTES / LINGER_SECONDS), then close: the client, still sending, gets to
        read the answer instead of a reset connection."""
        self.closing = True
        self.discarding = max(1, min(body_left, LINGER_BYTES))
        self._queue(HttpResponse(status, self.server.error_body(message)))
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self.close)

    def _queue(self, item: HttpRequest | HttpResponse) -> None:
        self.pending.append(item)
        if not self.busy:
            self._next()

    def _next(self) -> None:
        while self.pending and self.transport is not None:
            item = self.pending.popleft()
            if isinstance(item, bytes):
                self.transport.write(item)
                continue
            if isinstance(item, HttpResponse):
                self._write(item, head_only=False)
                continue
            self.busy = True
            task = asyncio.get_running_loop().create_task(self.server.handler(item))
            task.add_done_callback(lambda t, r=item: self._done(r, t))
            return
        self.busy = False
        if self.closing and not self.discarding:
            self.close()
        elif not self.pending:
            self.idle_since = time.monotonic()

    def _done(self, request: HttpRequest, task: asyncio.Task[HttpResponse]) -> None:
        try:
            response = task.result()
        except Exception as exc:  # the handler should not raise; never a trace either way
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = HttpResponse(
                500, self.server.error_body(f"internal error: {type(exc).__name__}: {exc}")
            )
        if self.transport is not None:
            self._write(response, head_only=request.method == "HEAD")
        self._next()

    def _write(self, response: HttpResponse, head_only: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        status = _STATUS_LINES.get(response.status) or _status_line(response.status)
        extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in response.headers)
        close = b"Connection: close\r\n" if self.closing and not self.pending else b""
        head = b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s%s%sServer: shipyard\r\n\r\n" % (
            status,
            response.content_type.encode("latin-1"),
            len(response.body),
            self.server.date,
            extra,
            close,
        )
        if head_only or not response.body:
            transport.write(head)
        elif len(response.body) < SMALL_BODY:
            transport.write(head + response.body)
        else:
            transport.writelines((head, response.body))


def install_uvloop() -> bool:
    """Use uvloop's event loop when it is installed (the serve extra has it); returns
    whether it is in use."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
