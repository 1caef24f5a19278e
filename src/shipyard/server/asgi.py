"""``shipyard server`` on the HTTP layer every shipyard server uses (``shipyard.http``).

Why not ``ThreadingHTTPServer`` any more (issue 27): its listen backlog was 5 and it ran a
thread per connection, so with 100 clients connecting at once a quarter got no answer for
10-30 s, and an idle connection was never closed. uvicorn (httptools on uvloop where
installed) accepts on an event loop with a real backlog; what uvicorn lacks of its own is
added by ``shipyard.http``'s ``GuardedProtocol`` (in its ASGI mode; the model server uses
its fast path), with the API server's own ``Limits`` (``api_limits``):

- a deadline for a whole request head from its first byte (slowloris: 408, then close),
  and a cap on its size counted as it arrives (431: httptools has none of its own);
- a body that stops arriving (no byte for ``read_timeout`` while the handler waits for
  it) closes the connection; an S3 upload of 5 GB may take long, but never stall;
- a connection that never sends is closed after the keep-alive timeout (uvicorn arms its
  timer only after a first response);
- a cap on open connections, answered 503 at once.

The service modules stay synchronous (SQLite, disk, tarfiles): every request is handled in
a worker thread (uploads in a pool of their own, so slow uploaders cannot take every thread) (``ApiServer.handle`` in app.py, where requests are authorized), never on
the event loop. Bodies up to ``PRELOAD`` bytes are read on the loop before the thread
starts; a larger one (an S3 upload) is read by the handler through ``_BodyStream`` straight
from uvicorn's receive queue, with uvicorn's flow control pausing the socket when the
handler reads slower than the client sends, so no body is ever buffered whole. File
answers (S3 GETs) are read from disk in the pool, a chunk at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from shipyard.http import adapter
from shipyard.http.adapter import uvicorn_server
from shipyard.http.limits import Limits
from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, json_response

log = logging.getLogger("shipyard.server")
PRELOAD = 1 << 20  # bodies up to this are read before the handler runs (every API call)
CHUNK = 1 << 20  # file answers are sent this many bytes at a time
HEALTH = "/_shipyard/health"


class Handler(Protocol):
    """What serves a parsed request (``app.ApiServer``): authorization, routing, errors."""

    def handle(self, req: Request) -> Response: ...

    def error_for(self, req: Request, status: int, code: str, message: str) -> Response: ...


def api_limits(**overrides: Any) -> Limits:
    """The API server's connection limits, sized for a team's notebooks and instances
    (``overrides`` names others: tests shorten the deadlines)."""
    values: dict[str, Any] = {
        "head_timeout": 30.0,  # a whole request line + headers, from its first byte
        "max_head": 64 << 10,  # their size (S3's own limit on headers is 8 KB of metadata)
        "read_timeout": 60.0,  # a body with no byte for this long while it is awaited
        "body_timeout": None,  # an S3 upload of 5 GB may take long, but never stall
        "keepalive_timeout": 75.0,  # an idle connection (also one that never sent)
        "max_connections": 4096,  # open connections; more are answered 503 and closed
        "max_body": None,  # each service decides (Request.read_body: 413)
    }
    values.update(overrides)
    return Limits(**values)


@dataclass
class Pools:
    """The server's threads and sockets (the connection limits are ``Limits``')."""

    backlog: int = 4096  # the listen queue (the kernel caps it at net.core.somaxconn)
    threads: int = 64  # requests handled at once (SQLite/disk work, small bodies)
    upload_threads: int = 32  # requests with a body over PRELOAD (streamed) at once
    shutdown_grace: float = 10.0  # SIGTERM: requests in flight get this long to finish


class _BodyStream(io.RawIOBase):
    """A request body read from a worker thread: each read asks the event loop for
    uvicorn's next body message. A client gone (or the connection closed for stalling)
    reads as end of file, as a socket does; the handler reports the short body."""

    def __init__(
        self,
        receive: Callable[[], Awaitable[dict[str, Any]]],
        loop: asyncio.AbstractEventLoop,
        wait: float,
        sized: bool = True,
    ) -> None:
        self._receive = receive
        self._loop = loop
        self._wait = wait  # no receive takes longer: the sweep closes a stalled body
        self._buf = bytearray()
        self.done = False
        # a chunked body has no length to compare with: a client gone before the last
        # chunk must read as an error, not as the end of a complete (shorter) body
        self._sized = sized
        self._cut = False

    def _fill(self) -> None:
        pending: Any = self._receive()
        future = asyncio.run_coroutine_threadsafe(pending, self._loop)
        try:
            message: dict[str, Any] = future.result(self._wait)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            # the loop stopped (shutdown) under a handler still reading: end of body,
            # so the worker thread ends and the process can exit
            future.cancel()
            self.done = self._cut = True
            return
        if message["type"] != "http.request":
            self.done = self._cut = True
            return
        self._buf += message.get("body", b"")
        if not message.get("more_body"):
            self.done = True

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buf) < n) and not self.done:
            self._fill()
        if self._cut and not self._sized and not self._buf:
            raise ApiError(
                "IncompleteBody", "the connection ended before the chunked body's last chunk"
            )
        if n < 0:
            n = len(self._buf)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def readline(self, limit: int | None = -1) -> bytes:
        limit = -1 if limit is None else limit
        while b"\n" not in self._buf and not self.done and (limit < 0 or len(self._buf) < limit):
            self._fill()
        cut = self._buf.find(b"\n")
        end = len(self._buf) if cut < 0 else cut + 1
        if limit >= 0:
            end = min(end, limit)
        return self.read(end)

    def readable(self) -> bool:
        return True


def app_for(
    api: Handler,
    pool: concurrent.futures.Executor,
    uploads: concurrent.futures.Executor,
    limits: Limits,
) -> Callable[[dict[str, Any], Any, Any], Awaitable[None]]:
    """The ASGI app: the request as the service modules see it, handled in ``pool``, or
    in ``uploads`` when its body is streamed (a slow uploader holds its thread for as long
    as it sends, so uploads never take the threads API calls are answered from)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        loop = asyncio.get_running_loop()
        method = scope["method"]
        raw_path = scope["raw_path"].decode("latin-1")
        if raw_path == HEALTH and method == "GET":
            await _send(send, method, json_response({"status": "ok"}), loop, pool)
            return  # liveness only: says nothing else, and never waits for a thread
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        req = Request(
            method, raw_path, scope["query_string"].decode("latin-1"), headers, io.BytesIO(), 0
        )
        chunked = "transfer-encoding" in headers
        if chunked and headers["transfer-encoding"].strip().lower() != "chunked":
            resp = Response(501, b"Transfer-Encoding: chunked only")
            await _send(send, method, resp, loop, pool, close=True)
            return
        try:
            length = -1 if chunked else int(headers.get("content-length") or 0)
            if length < 0 and not chunked:
                raise ValueError
        except ValueError:
            await _send(send, method, Response(400, b"bad Content-Length"), loop, pool, close=True)
            return
        req.length = length  # -1: a chunked body (uvicorn decodes it), S3 uploads only
        stream: _BodyStream | None = None
        # uvicorn answers "100 Continue" on the app's first receive(): a client that waits
        # for it gets it only when the handler reads the body, after the request's headers
        # are authenticated (a refusal is its final answer, and no body is sent)
        waits = headers.get("expect", "").strip().lower() == "100-continue"
        if 0 <= length <= PRELOAD and not waits:
            chunks = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client left before its body arrived
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            req.stream = io.BytesIO(b"".join(chunks))
        else:
            stream = _BodyStream(receive, loop, limits.read_timeout + 5.0, sized=not chunked)
            req.stream = stream  # type: ignore[assignment]
        try:
            resp = await loop.run_in_executor(pool if stream is None else uploads, api.handle, req)
        except Exception as exc:  # noqa: BLE001 - api.handle answers errors; a bug here too
            log.exception("internal error on %s %s", method, raw_path)
            resp = api.error_for(req, 500, "InternalFailure", f"internal error: {exc}")
        # a large body the handler did not read (a refusal) ends the connection: never
        # read gigabytes only to drop them
        close = stream is not None and not stream.done
        await _send(send, method, resp, loop, pool, close=close)

    return app


async def _send(
    send: Any,
    method: str,
    resp: Response,
    loop: asyncio.AbstractEventLoop,
    pool: concurrent.futures.Executor,
    close: bool = False,
) -> None:
    length = resp.length if resp.file else len(resp.body)
    if method == "HEAD" and "Content-Length" in resp.headers:
        length = int(resp.headers["Content-Length"])  # what a GET would send
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in resp.headers.items()
        if name.lower() != "content-length"
    ]
    headers.append((b"content-length", str(length).encode()))
    if "x-amz-request-id" not in resp.headers:  # S3 names its own (botocore prefers this one)
        headers.append((b"x-amzn-requestid", b"shipyard"))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    if method == "HEAD" or not resp.file:
        if resp.handle is not None:
            resp.handle.close()
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else resp.body})
        return
    fh: BinaryIO
    if resp.handle is not None:  # opened by the handler: the bytes its headers describe
        fh = resp.handle
    else:
        fh = await loop.run_in_executor(pool, open, resp.file, "rb")
    try:
        await loop.run_in_executor(pool, fh.seek, resp.offset)
        left = resp.length
        while left > 0:
            chunk = await loop.run_in_executor(pool, fh.read, min(CHUNK, left))
            if not chunk:
                break  # the file shrank under us: the client sees a short body
            left -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})
        if left > 0:
            raise OSError(f"{resp.file} ended {left} bytes early")
    finally:
        fh.close()


class Server:
    """uvicorn serving ``api`` on an already-bound socket, with ``Limits`` and ``Pools``."""

    def __init__(
        self, api: Handler, limits: Limits | None = None, pools: Pools | None = None
    ) -> None:
        self.limits = limits or api_limits()
        self.pools = pools or Pools()
        self.pool = concurrent.futures.ThreadPoolExecutor(
            self.pools.threads, thread_name_prefix="shipyard-api"
        )
        self.uploads = concurrent.futures.ThreadPoolExecutor(
            self.pools.upload_threads, thread_name_prefix="shipyard-upload"
        )
        self.server = uvicorn_server(
            app_for(api, self.pool, self.uploads, self.limits),
            self.limits,
            name="shipyard server",
            backlog=self.pools.backlog,
            shutdown_grace=self.pools.shutdown_grace,
        )

    async def serve(self, sock: Any) -> None:
        try:
            await adapter.serve(self.server, [sock])
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.uploads.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self.server.should_exit = True


def run(server: Server, sock: Any) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handling: requests in flight finish), on
    uvloop when it is installed."""
    adapter.run(server.serve(sock))
