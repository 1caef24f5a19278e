"""``GuardedProtocol``: the one uvicorn protocol subclass of shipyard (httptools), with
the limits a server facing clients needs and uvicorn lacks of its own (``Limits``), in
one of two modes chosen by its server:

- **ASGI** (``handler`` is None: ``shipyard server``, the dashboard): uvicorn's own
  request cycle runs the ASGI app; this class adds the guards around it.
- **fast path** (``handler`` set: a model server's worker): the parser callbacks build an
  ``HttpRequest`` themselves (no ASGI scope, header list, ``RequestResponseCycle``,
  ``asyncio.Event``, receive/send coroutines or message dicts: about 22 us of CPU per
  request, half the echo's, docs/decisions.md issue 19), the handler runs in one task
  once the body is whole, and its answer is framed and written in one ``transport.write``.
  uvicorn's ordering rules are kept as its cycle had them: one request answered at a time
  per connection, a pipelined one queued with reading paused until the answers before it
  are written, ``100 Continue`` sent only when a request's turn comes, ``Connection:
  close`` for HTTP/1.0 and on shutdown, writes held while the transport is paused.

The guards, in both modes (tests/unit/http, tests/unit/serving/test_front_end.py,
tests/unit/server/test_asgi.py, each over real sockets):

- a deadline for a whole request head from its first byte, however steadily it trickles
  in (slowloris: 408, then close); uvicorn only has a keep-alive timeout, which any byte
  resets;
- 431 for a head over ``max_head`` bytes, counted as the bytes arrive (httptools keeps a
  header's pieces until the header ends, so a header that never ends would grow);
- a body that stops arriving (no byte for ``read_timeout`` while it is awaited) closes
  the connection; the fast path also has a deadline for a whole body (408);
- a cap on open connections, answered 503 at once (uvicorn's ``limit_concurrency``
  answers only once a request head is complete, so idle sockets were never refused);
- a client that connects and never sends is closed after the keep-alive timeout (uvicorn
  arms that timer only after a first response).

The fast path also refuses a body over ``max_body`` (413, from the announced length or
while a chunked body arrives, then a lingering close so a client still sending reads the
answer) and queues every refusal behind the answers to the requests before it on the
connection (uvicorn writes its own 400 at once, ahead of answers still being computed).
Every refusal is written by ``refusal.refusal``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
)

from shipyard.http.limits import Limits
from shipyard.http.refusal import refusal
from shipyard.http.types import Handler, HttpRequest, HttpResponse

log = logging.getLogger("shipyard.http")

LINGER_SECONDS = 2.0  # after a 413, how long the rest of the body is read and dropped
LINGER_BYTES = 64 << 20  # ... and how much of it at most


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


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``Limits``; the fast path when ``handler`` is
    set. ``limits``, ``handler`` and ``name`` are set on the subclass
    ``adapter.uvicorn_server`` makes (uvicorn constructs protocols itself)."""

    limits: Limits
    handler: Handler | None = None
    name = "this server"  # who refuses at the connection cap ("this worker has ...")

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
        self.in_body = False  # ASGI mode: a request whose body has not all arrived
        # the mode, read by every parser callback: an instance flag (not the class's
        # ``handler`` looked up through the type on each call)
        self.asgi = self.handler is None

    # -- transport events -------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = self.limits
        if len(self.connections) >= limits.max_connections:
            self.transport = transport
            transport.write(
                self._answer(
                    503,
                    f"{self.name} has {limits.max_connections} connections open, its limit; "
                    "retry shortly or reuse a keep-alive connection",
                )
            )
            transport.close()
            return
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.last_data = time.monotonic()
        if self.asgi:
            self._asgi_data_received(data)
            return
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

    def _asgi_data_received(self, data: bytes) -> None:
        """uvicorn's parsing and its own 400s, then the head's bytes counted (431)."""
        super().data_received(data)
        if self.head_since is not None and not self.transport.is_closing():
            # httptools keeps a head's pieces until it ends: count them as they come
            self._head_raw += len(data)
            if self._head_raw > self.limits.max_head:
                self._refuse_now(
                    431, f"request line and headers are over {self.limits.max_head} bytes"
                )

    def _refuse_now(self, status: int, message: str) -> None:
        """ASGI mode's refusal: written at once, then close, as the API server always
        did (uvicorn's cycle owns the order of answers and has no queue to join)."""
        self.transport.write(self._answer(status, message))
        self.transport.close()

    def _asgi_tick(self, now: float) -> None:
        """ASGI mode's sweep: the head deadline, a stalled body, a connection never used
        (after a first answer uvicorn's own keep-alive timer closes an idle one)."""
        limits = self.limits
        if self.head_since is not None:
            if now - self.head_since > limits.head_timeout:
                self._refuse_now(
                    408, f"request headers not complete within {limits.head_timeout:g} s"
                )
        elif self.in_body and self.cycle is not None and not self.cycle.response_complete:
            # the app waits on this body (a paused read is the app being slow)
            if not self.flow.read_paused and now - self.last_data > limits.read_timeout:
                log.info("closing a connection whose request body stalled")
                self.transport.close()
        elif self.cycle is None and now - self.last_data > limits.keepalive_timeout:
            self.transport.close()  # connected and never sent a request

    def tick(self, now: float) -> None:
        """Once a second (``adapter.Sweep``): the head and body deadlines, stalled bodies, and
        the keep-alive timeout. uvicorn cancels and re-arms a timer for that on every
        request (about 2 us of its CPU per request); counted here it closes an idle
        connection within a second after the timeout, and also one that never sent
        (uvicorn arms its timer only after a first response)."""
        if self.refusal is not None or self.transport is None or self.transport.is_closing():
            return
        if self.asgi:
            self._asgi_tick(now)
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
            if limits.body_timeout is not None and now - self.body_since > limits.body_timeout:
                self.refuse(
                    408,
                    f"request body not complete within {limits.body_timeout:g} s of its "
                    "headers; send it faster, or smaller requests",
                )
            elif now - self.last_data > limits.read_timeout:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.asgi:
            super().connection_lost(exc)
            return
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
        if self.asgi:
            self.head_since = time.monotonic()
            self._head_raw = 0
            super().on_message_begin()
            return
        self.cycle = _Exchange()
        self.head_since = self.last_data
        self._begun += 1
        self._length = None
        self._head_raw = self._head_len = self._body_len = 0

    def on_url(self, url: bytes) -> None:
        if self.asgi:
            super().on_url(url)
            return
        self._head_len += len(url)
        if self._head_len > self.limits.max_head:
            raise _HeadTooLarge
        self.cycle.url += url  # type: ignore[union-attr]

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.asgi:
            super().on_header(name, value)
            return
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
        if self.asgi:
            self.in_body = True
            super().on_headers_complete()
            return
        length, limit = self._length, self.limits.max_body
        if limit is not None and length is not None and length.isdigit() and int(length) > limit:
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
        if self.asgi:
            super().on_body(body)
            return
        self._body_len += len(body)
        limit = self.limits.max_body
        if limit is not None and self._body_len > limit:  # chunked, or more than announced
            self.refuse(
                413,
                f"body is over the payload limit of {limit} bytes (MaxPayloadInMB)",
                linger=LINGER_BYTES,
            )
            raise _Refused
        self.cycle.chunks.append(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        if self.asgi:
            self.in_body = False
            super().on_message_complete()
            return
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
            response = await self.handler(request)  # type: ignore[misc]
        except Exception as exc:  # the handler should not raise; never a trace either way
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = self._internal_error(exc)
        if self.flow.write_paused and not ex.disconnected:
            await self.flow.drain()
        if ex.disconnected:
            return
        try:
            data = _response_bytes(ex, response, self.server_state.default_headers)
        except ValueError as exc:
            log.error("unsendable answer to %s %s: %s", request.method, request.path, exc)
            data = _response_bytes(ex, self._internal_error(exc), self.server_state.default_headers)
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

    def on_response_complete(self) -> None:
        if self.asgi:
            super().on_response_complete()
            return
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
        return refusal(status, message, self.limits, self.server_state.default_headers)


def _response_bytes(
    ex: _Exchange, response: HttpResponse, default_headers: list[tuple[bytes, bytes]]
) -> bytes:
    """The status line, headers and body in one piece, for one ``write`` (uvicorn's
    cycle writes the head and the body apart: two send() calls, and under
    TCP_NODELAY two packets for the client to wake up for)."""
    head = [STATUS_LINE[response.status]]
    for default_name, default_value in default_headers:
        head += [default_name, b": ", default_value, b"\r\n"]
    content_type = response.content_type.encode("latin-1")
    if HEADER_VALUE_RE.search(content_type):
        raise ValueError(f"content type {response.content_type!r} has a control character")
    head.append(b"content-type: %s\r\ncontent-length: %d\r\n" % (content_type, len(response.body)))
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
