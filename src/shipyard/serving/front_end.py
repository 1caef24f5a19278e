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

uvicorn itself keeps pipelined answers in order and sends ``100 Continue`` only when the
handler asks for the body, which it does after the answers before it are written.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from shipyard.serving.asgi import asgi_app
from shipyard.serving.http_types import Handler

log = logging.getLogger("shipyard.serving")

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


class _OneWrite:
    """The transport as a request/response cycle sees it: a response's head is held and
    written with the first part of its body, in one write. uvicorn writes them apart,
    which costs a second send() and, under TCP_NODELAY, a second packet for the client
    to wake up for. A ``100 Continue`` (written before the response starts) goes at
    once; a head with no body write after it (HEAD) goes when the response completes."""

    __slots__ = ("transport", "cycle", "head", "headed")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self.transport = transport
        self.cycle = cycle
        self.head: bytes | None = None
        self.headed = False

    def write(self, data: bytes) -> None:
        if self.head is not None:
            data = self.head + data
            self.head = None
        elif not self.headed and self.cycle.response_started:
            self.headed = True
            self.head = data
            return
        self.transport.write(data)

    def flush(self) -> None:
        if self.head is not None:
            self.transport.write(self.head)
            self.head = None

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above. ``limits`` is set on the
    subclass each ``FrontEnd`` makes (uvicorn constructs protocols itself)."""

    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_data = time.monotonic()  # when bytes last arrived
        self.head_since: float | None = None  # first byte of a head still incomplete
        self.body_since: float | None = None  # end of a head whose body is incomplete
        self.refusal: bytes | None = None  # the answer that ends this connection
        self.discarding = 0  # > 0: bytes of a refused body still to drop (lingering close)
        self._linger = 0
        self._running: Any = None  # the request/response cycle being handled
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
        # uvicorn arms this only after a response: a client that never sends would stay
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def data_received(self, data: bytes) -> None:
        self.last_data = time.monotonic()
        if self.discarding:
            self.discarding -= min(self.discarding, len(data))
            if not self.discarding:
                self.transport.close()
            return
        if self.refusal is not None:  # refused: nothing more is read into requests
            return
        self._unset_keepalive_if_required()
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
        """Once a second (``FrontEnd``): the head and body deadlines, stalled bodies."""
        if self.refusal is not None or self.transport is None or self.transport.is_closing():
            return
        limits = self.limits
        if self.head_since is not None:
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

    # -- parser callbacks (httptools) ----------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_since = self.last_data
        self._begun += 1
        self._length = None
        self._head_raw = self._head_len = self._body_len = 0

    def on_url(self, url: bytes) -> None:
        self._head_len += len(url)
        if self._head_len > self.limits.max_head:
            raise _HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_len += len(name) + len(value)
        if self._head_len > self.limits.max_head:
            raise _HeadTooLarge
        if len(name) == 14 and name.lower() == b"content-length":
            self._length = value
        super().on_header(name, value)

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
        super().on_headers_complete()
        cycle = self.cycle
        cycle.transport = _OneWrite(self.transport, cycle)  # type: ignore[assignment]
        self.body_since = self.last_data

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self.limits.max_body:  # chunked, or more than announced
            self.refuse(
                413,
                f"body is over the payload limit of {self.limits.max_body} bytes (MaxPayloadInMB)",
                linger=LINGER_BYTES,
            )
            raise _Refused
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.body_since = None
        super().on_message_complete()

    # -- answering ------------------------------------------------------------------------
    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        if self._running is not None:
            self._running.transport.flush()
        if self.refusal is not None and not self.pipeline:
            self.server_state.total_requests += 1
            self._send_refusal()
            return
        super().on_response_complete()

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
            if self.pipeline and self.pipeline[0][0] is cycle:
                self.pipeline.popleft()  # queued behind others: never started
            else:
                cycle.disconnected = True  # being handled: it stops waiting for its body
                cycle.message_event.set()
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

        self.limits = Limits(max_body, error_body, **limits)
        protocol = type("BoundHttpProtocol", (LimitedHttpProtocol,), {"limits": self.limits})
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
