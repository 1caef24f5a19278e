"""HTTP/1.1 for a serving worker: uvicorn (the httptools parser, on uvloop) serving the
worker's shared socket, with the limits a model server facing clients needs and uvicorn
does not have of its own.

Why uvicorn and not a hand-written layer: the same handler behind both measured 0.95x
(2 workers) and 1.06x (1 worker) of a hand-written httptools protocol on the model at
c=8 on quiet cores (BENCHMARKS.md, issue 19), inside the 10% that was the rule for
adopting the maintained one (docs/decisions.md).

What ``LimitedHttpProtocol`` adds to uvicorn's httptools protocol, each tested over real
sockets (tests/unit/serving/test_front_end.py):

- a deadline for a whole request head, counted from its first byte however steadily it
  trickles in (slowloris: 408, then close); uvicorn only has a keep-alive timeout, which
  any byte resets;
- a deadline for a whole request body from the end of its head (408), and a connection
  whose body stops arriving is closed after ``read_timeout`` without a byte;
- a cap on connections per worker, answered 503 at once (uvicorn's
  ``limit_concurrency`` answers only once a request head is complete, so idle sockets
  were never refused);
- 431 for a head over ``max_head`` bytes, counted as the bytes arrive (httptools keeps a
  header's pieces until the header ends, so a header that never ends would grow);
- the body limit (413) enforced from the announced length or while a chunked body
  arrives, then a lingering close, so a client still sending reads the answer;
- every refusal (400, 408, 413, 431) queued behind the answers to the requests before
  it on the connection, with the JSON error body the handler's errors have; uvicorn
  writes its own 400 at once, ahead of answers still being computed;
- a client that connects and never sends is closed after the keep-alive timeout
  (uvicorn arms that timer only after a first response).

What it takes out of uvicorn's per-request path (docs/decisions.md, issue 19: about 22 us
of CPU per request, half the echo's): the parser callbacks build the handler's
``HttpRequest`` themselves (no ASGI scope, header list, ``RequestResponseCycle``,
``asyncio.Event``, receive/send coroutines or message dicts), the handler runs in one task
once the body is whole, and its answer is framed and written in one ``transport.write``;
the keep-alive timeout is counted by the once-a-second sweep instead of a timer re-armed
per request. uvicorn's ordering rules are kept as its cycle had them: one request
answered at a time per connection, a pipelined one queued with reading paused until the
answers before it are written, ``100 Continue`` sent only when a request's turn comes,
``Connection: close`` for HTTP/1.0 and on shutdown, writes held while the transport
is paused. uvicorn keeps the parser, transport, flow control and the server's lifecycle
(sockets, graceful shutdown, the date header).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
)

from shipyard.serving.asgi import asgi_app
from shipyard.serving.http_types import Handler, HttpRequest, HttpResponse

log = logging.getLogger("shipyard.serving")

#: The uvicorn release ``LimitedHttpProtocol`` is written and tested against: it subclasses
#: uvicorn's httptools protocol and uses its internals (``Server._serve``, the protocol's
#: cycle attributes), which a release may change. constraints.txt pins exactly this one
#: (tests/unit/serving/test_uvicorn_pin.py checks they agree); another logs a warning.
UVICORN_TESTED = "0.54.0"


def uvicorn_note(installed: str) -> str | None:
    """What to tell the operator when the installed uvicorn is not the tested one."""
    if installed == UVICORN_TESTED:
        return None
    return (
        f"shipyard's model server subclasses uvicorn's httptools protocol and is tested "
        f"with uvicorn {UVICORN_TESTED} only; uvicorn {installed} is installed. If requests "
        f"misbehave, install the tested one: pip install uvicorn=={UVICORN_TESTED}"
    )


KEEPALIVE_TIMEOUT = 75.0  # seconds an idle keep-alive connection is kept (aiohttp's default)
READ_TIMEOUT = 60.0  # seconds a half-received body may go without a byte
HEAD_TIMEOUT = 10.0  # seconds from a request's first byte to the end of its headers
BODY_TIMEOUT = 60.0  # seconds from the end of the headers to the end of the body
MAX_CONNECTIONS = 1000  # open connections per worker (each costs a descriptor and buffers)
LINGER_SECONDS = 2.0  # after a 413, how long the rest of the body is read and dropped
LINGER_BYTES = 64 << 20  # ... and how much of it at most
MAX_HEADER_BYTES = 64 << 10  # request line + headers


@dataclass(frozen=True)
class Limits:
    max_body: int
    error_body: Callable[[str], bytes]
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    head_timeout: float = HEAD_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    max_head: int = MAX_HEADER_BYTES


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools wraps it, the protocol answers 431."""


class _Refused(Exception):
    """Raised from a parser callback once a refusal is queued: stop parsing."""


class _Exchange:
    """One request and the state of its answer: what uvicorn's ``RequestResponseCycle``
    plus its ASGI scope, receive/send coroutines and message dicts held, cut to what a
    ``handler(HttpRequest) -> HttpResponse`` needs (the whole body, then one answer).
    The attribute names uvicorn's own protocol code reads (``response_complete``,
    ``keep_alive``, ``disconnected``, ``more_body``) keep their meaning."""

    __slots__ = (
        "method",
        "url",
        "path",
        "query",
        "headers",
        "chunks",
        "expect_continue",
        "keep_alive",
        "more_body",
        "started",
        "response_complete",
        "disconnected",
    )

    def __init__(self) -> None:
        self.method = ""
        self.url = b""
        self.path = ""
        self.query = ""
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.expect_continue = False
        self.keep_alive = True
        self.more_body = True
        self.started = False
        self.response_complete = False
        self.disconnected = False


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above. ``limits`` is set on the
    subclass each ``FrontEnd`` makes (uvicorn constructs protocols itself)."""

    limits: Limits
    handler: Handler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cycle: _Exchange | None = None  # type: ignore[assignment]  # the one parsing
        # complete heads waiting for their turn, oldest first (uvicorn's holds cycles)
        self.pipeline: deque[_Exchange] = deque()  # type: ignore[assignment]
        self.last_data = time.monotonic()  # when bytes last arrived
        self.last_answer = 0.0  # when an answer was last written
        self.head_since: float | None = None  # first byte of a head still incomplete
        self.body_since: float | None = None  # end of a head whose body is incomplete
        self.refusal: bytes | None = None  # the answer that ends this connection
        self.discarding = 0  # > 0: bytes of a refused body still to drop (lingering close)
        self._linger = 0
        self._running: _Exchange | None = None  # the exchange being answered
        self._length: bytes | None = None  # the current request's Content-Length
        self._head_len = 0
        self._head_raw = 0  # bytes of whole reads that went to the current head
        self._body_len = 0
        self._begun = 0  # requests begun on this connection

    # -- transport events -------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = self.limits
        if len(self.connections) >= limits.max_connections:
            self.transport = transport
            transport.write(
                self._answer(
                    503,
                    f"this worker has {limits.max_connections} connections open, its limit; "
                    "retry shortly or reuse a keep-alive connection",
                )
            )
            transport.close()
            return
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.last_data = time.monotonic()
        if self.discarding:
            self.discarding -= min(self.discarding, len(data))
            if not self.discarding:
                self.transport.close()
            return
        if self.refusal is not None:  # refused: nothing more is read into requests
            return
        begun = self._begun
        try:
            self.parser.feed_data(data)
            if self.head_since is not None and self._begun == begun:
                # the whole read went to one head that is still not complete: count it
                # here, as httptools keeps a header's pieces until the header ends
                self._head_raw += len(data)
                if self._head_raw > self.limits.max_head:
                    raise _HeadTooLarge
        except httptools.HttpParserUpgrade:
            self.refuse(400, "protocol upgrades are not supported")
        except (httptools.HttpParserError, _HeadTooLarge) as exc:
            if self.refusal is not None:  # a callback refused and stopped the parser
                return
            if _HeadTooLarge in (type(exc), type(exc.__cause__), type(exc.__context__)):
                self.refuse(
                    431,
                    f"request line and headers are over {self.limits.max_head} bytes; "
                    "send large values in the body",
                )
            else:
                self.refuse(400, f"malformed HTTP request: {exc}")

    def tick(self, now: float) -> None:
        """Once a second (``FrontEnd``): the head and body deadlines, stalled bodies, and
        the keep-alive timeout. uvicorn cancels and re-arms a timer for that on every
        request (about 2 us of its CPU per request); counted here it closes an idle
        connection within a second after the timeout, and also one that never sent
        (uvicorn arms its timer only after a first response)."""
        if self.refusal is not None or self.transport is None or self.transport.is_closing():
            return
        limits = self.limits
        running = self._running
        if (
            self.head_since is None
            and self.body_since is None
            and (running is None or running.response_complete)
            and now - max(self.last_data, self.last_answer) > limits.keepalive_timeout
        ):
            self.transport.close()
        elif self.head_since is not None:
            if now - self.head_since > limits.head_timeout:
                self.refuse(408, f"request headers not complete within {limits.head_timeout:g} s")
        elif self.body_since is not None and not self.pipeline and not self.flow.read_paused:
            # the body being read is the request being handled (a queued one waits on us)
            if now - self.body_since > limits.body_timeout:
                self.refuse(
                    408,
                    f"request body not complete within {limits.body_timeout:g} s of its "
                    "headers; send it faster, or smaller requests",
                )
            elif now - self.last_data > limits.read_timeout:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        # uvicorn's, less its cycle's message event (an exchange has none to wake)
        self.connections.discard(self)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
        running = self._running
        if running is not None and not running.response_complete:
            running.disconnected = True
        if self.flow is not None:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
            self._unset_keepalive_if_required()
        self.parser = None  # type: ignore[assignment]

    # -- parser callbacks (httptools) ----------------------------------------------------
    # They build the handler's request directly (uvicorn's build an ASGI scope, headers
    # list and cycle, then its receive/send turn them into messages and back): the
    # per-request Python the profile in docs/decisions.md (issue 19) counted.
    def on_message_begin(self) -> None:
        self.cycle = _Exchange()
        self.head_since = self.last_data
        self._begun += 1
        self._length = None
        self._head_raw = self._head_len = self._body_len = 0

    def on_url(self, url: bytes) -> None:
        self._head_len += len(url)
        if self._head_len > self.limits.max_head:
            raise _HeadTooLarge
        self.cycle.url += url  # type: ignore[union-attr]

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_len += len(name) + len(value)
        if self._head_len > self.limits.max_head:
            raise _HeadTooLarge
        key = name.decode("latin-1").lower()
        if key == "content-length":
            self._length = value
        elif key == "expect" and value.lower() == b"100-continue":
            self.cycle.expect_continue = True  # type: ignore[union-attr]
        self.cycle.headers[key] = value.decode("latin-1")  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        self.head_since = None
        length, limit = self._length, self.limits.max_body
        if length is not None and length.isdigit() and int(length) > limit:
            self.refuse(
                413,
                f"body of {length.decode()} bytes is over the payload limit of {limit} bytes "
                "(MaxPayloadInMB)",
                linger=int(length),
            )
            raise _Refused  # the body is dropped, not parsed; no 100 Continue is sent
        parser = self.parser
        if parser.should_upgrade():  # no websockets here: answered 400 like any upgrade
            self.refuse(400, "protocol upgrades are not supported")
            raise _Refused
        ex: _Exchange = self.cycle  # type: ignore[assignment]
        ex.method = parser.get_method().decode("ascii")
        url = ex.url
        path, _, query = url.partition(b"?")
        if b"#" in url or not path.startswith(b"/"):
            parsed = httptools.parse_url(url)  # rare forms: the parser's URL rules decide
            path, query = parsed.path, parsed.query or b""
        ex.path = path.decode("ascii")  # as uvicorn: a raw non-ASCII path is a 400
        if "%" in ex.path:
            ex.path = unquote(ex.path)
        ex.query = query.decode("latin-1")
        ex.keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        self.body_since = self.last_data
        running = self._running
        if running is None or running.response_complete:
            self._start(ex)
        else:  # pipelined behind an answer still being computed: its turn comes later
            self.flow.pause_reading()
            self.pipeline.append(ex)

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self.limits.max_body:  # chunked, or more than announced
            self.refuse(
                413,
                f"body is over the payload limit of {self.limits.max_body} bytes (MaxPayloadInMB)",
                linger=LINGER_BYTES,
            )
            raise _Refused
        self.cycle.chunks.append(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        self.body_since = None
        ex: _Exchange = self.cycle  # type: ignore[assignment]
        ex.more_body = False
        if ex.started and not ex.disconnected:
            self._dispatch(ex)

    # -- answering ------------------------------------------------------------------------
    def _start(self, ex: _Exchange) -> None:
        """``ex``'s turn: the answers before it are written. Its body is read from now
        (``100 Continue`` first when the client waits for one); the handler runs once
        the body is whole (uvicorn's app asks for the body at this point, too)."""
        ex.started = True
        self._running = ex
        if ex.more_body:
            if ex.expect_continue and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.flow.resume_reading()
        else:
            self._dispatch(ex)

    def _dispatch(self, ex: _Exchange) -> None:
        task = self.loop.create_task(self._answer_with_handler(ex))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _answer_with_handler(self, ex: _Exchange) -> None:
        chunks = ex.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        ex.chunks = []
        request = HttpRequest(ex.method, ex.path, ex.query, ex.headers, body)
        try:
            response = await self.handler(request)
        except Exception as exc:  # the handler should not raise; never a trace either way
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = self._internal_error(exc)
        if self.flow.write_paused and not ex.disconnected:
            await self.flow.drain()
        if ex.disconnected:
            return
        try:
            data = self._response_bytes(ex, response)
        except ValueError as exc:
            log.error("unsendable answer to %s %s: %s", request.method, request.path, exc)
            data = self._response_bytes(ex, self._internal_error(exc))
        ex.response_complete = True
        transport = self.transport
        transport.write(data)
        if not ex.keep_alive:
            transport.close()
        self.on_response_complete()

    def _internal_error(self, exc: Exception) -> HttpResponse:
        return HttpResponse(
            500, self.limits.error_body(f"internal error: {type(exc).__name__}: {exc}")
        )

    def _response_bytes(self, ex: _Exchange, response: HttpResponse) -> bytes:
        """The status line, headers and body in one piece, for one ``write`` (uvicorn's
        cycle writes the head and the body apart: two send() calls, and under
        TCP_NODELAY two packets for the client to wake up for)."""
        head = [STATUS_LINE[response.status]]
        for default_name, default_value in self.server_state.default_headers:
            head += [default_name, b": ", default_value, b"\r\n"]
        content_type = response.content_type.encode("latin-1")
        if HEADER_VALUE_RE.search(content_type):
            raise ValueError(f"content type {response.content_type!r} has a control character")
        head.append(
            b"content-type: %s\r\ncontent-length: %d\r\n" % (content_type, len(response.body))
        )
        for name, value in response.headers:
            key, val = name.lower().encode("latin-1"), value.encode("latin-1")
            if HEADER_RE.search(key) or HEADER_VALUE_RE.search(val):
                raise ValueError(f"header {name!r}: {value!r} is not a valid HTTP header")
            if key == b"connection" and b"close" in val.lower():
                ex.keep_alive = False
                continue
            head += [key, b": ", val, b"\r\n"]
        if not ex.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if ex.method != "HEAD":
            head.append(response.body)
        return b"".join(head)

    def on_response_complete(self) -> None:
        if self.refusal is not None and not self.pipeline:
            self.server_state.total_requests += 1
            self._send_refusal()
            return
        # uvicorn's: count, resume reading, start the next pipelined request (the
        # keep-alive timeout is counted from here by ``tick``)
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.last_answer = time.monotonic()
        self.flow.resume_reading()
        if self.pipeline:
            self._start(self.pipeline.popleft())

    def refuse(self, status: int, message: str, linger: int = 0) -> None:
        """End the connection with ``status``, written after the answers to the requests
        before it; then close (when ``linger`` > 0, after reading and dropping up to that
        many bytes the client may still be sending). Nothing more is parsed."""
        self.head_since = self.body_since = None
        self.refusal = self._answer(status, message)
        self._linger = min(linger, LINGER_BYTES)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.more_body:
            # the request whose body broke off gets this answer instead of its own
            if self.pipeline and self.pipeline[-1] is cycle:
                self.pipeline.pop()  # queued behind others: never started
            else:
                cycle.disconnected = True  # its turn came: the handler never runs
        running = self._running
        if self.pipeline or (
            running is not None and not running.response_complete and not running.disconnected
        ):
            return  # on_response_complete sends it once the answers before it are out
        self._send_refusal()

    def _send_refusal(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self.refusal is None:
            return
        transport.write(self.refusal)
        if self._linger:
            self.discarding = self._linger
            if self.flow is not None:
                self.flow.resume_reading()
            self.loop.call_later(LINGER_SECONDS, transport.close)
        else:
            transport.close()

    def _answer(self, status: int, message: str) -> bytes:
        body = self.limits.error_body(message)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % len(body)
        )
        return b"".join(head) + body


class FrontEnd:
    """uvicorn serving an already-bound, shared socket inside this worker through
    ``LimitedHttpProtocol``; ``start`` returns once it accepts, ``stop`` lets requests in
    flight finish (up to ``grace`` seconds) and closes every connection."""

    def __init__(
        self,
        handler: Handler,
        max_body: int,
        error_body: Callable[[str], bytes],
        **limits: Any,
    ) -> None:
        import uvicorn

        note = uvicorn_note(uvicorn.__version__)
        if note:
            log.warning(note)
        self.limits = Limits(max_body, error_body, **limits)
        protocol = type(
            "BoundHttpProtocol",
            (LimitedHttpProtocol,),
            {"limits": self.limits, "handler": staticmethod(handler)},
        )
        config = uvicorn.Config(
            asgi_app(handler, max_body, error_body),
            http=protocol,
            ws="none",
            loop="none",
            lifespan="off",
            interface="asgi3",
            access_log=False,
            log_config=None,
            log_level="warning",
            server_header=False,
            proxy_headers=False,  # no proxy in front of a worker: no middleware per request
            headers=[("server", "shipyard")],
            timeout_keep_alive=self.limits.keepalive_timeout,  # type: ignore[arg-type]
        )
        self.server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None
        self._tick: asyncio.TimerHandle | None = None

    async def start(self, sock: socket.socket, backlog: int = 1024) -> None:
        self.server.config.backlog = backlog
        # uvicorn's serve() without its signal capture (the worker handles SIGTERM)
        self._task = asyncio.get_running_loop().create_task(self.server._serve([sock]))
        while not self.server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("uvicorn stopped while starting")
            await asyncio.sleep(0.01)
        self._sweep()

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.server.server_state.connections):
            if isinstance(conn, LimitedHttpProtocol):
                conn.tick(now)
        self._tick = asyncio.get_running_loop().call_later(1.0, self._sweep)

    async def stop(self, grace: float = 10.0) -> None:
        if self._tick is not None:
            self._tick.cancel()
        self.server.config.timeout_graceful_shutdown = max(1, round(grace))
        self.server.should_exit = True
        if self._task is not None:
            await self._task
        for conn in list(self.server.server_state.connections):
            if conn.transport is not None:
                conn.transport.close()


def install_uvloop() -> bool:
    """Use uvloop's event loop when it is installed (the serve extra has it); returns
    whether it is in use."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
