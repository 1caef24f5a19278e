"""HTTP/1.1 for a serving worker: the shared HTTP layer's uvicorn adapter (``shipyard.http``)
on the fast path, serving the worker's shared socket with the model server's limits.

Why uvicorn and not a hand-written layer: the same handler behind both measured 0.95x
(2 workers) and 1.06x (1 worker) of a hand-written httptools protocol on the model at
c=8 on quiet cores (BENCHMARKS.md, issue 19), inside the 10% that was the rule for
adopting the maintained one (docs/decisions.md).

The protocol, its limits and its refusals are ``shipyard.http``'s (one for every shipyard
server, issue 36); what is the model server's is here: its limits (a head in 10 s, a body
in 60 s, 1,000 connections per worker, ``MaxPayloadInMB``, JSON error bodies) and the
fast path to ``handler(HttpRequest) -> HttpResponse``, with the same handler behind an
ASGI app for uvicorn to hold (``asgi.py``; the fast path never calls it).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from shipyard.http.adapter import install_uvloop, sweep, uvicorn_server
from shipyard.http.limits import Limits
from shipyard.serving.asgi import asgi_app
from shipyard.serving.http_types import Handler

log = logging.getLogger("shipyard.serving")

__all__ = ["FrontEnd", "install_uvloop", "worker_limits"]

KEEPALIVE_TIMEOUT = 75.0  # seconds an idle keep-alive connection is kept (aiohttp's default)
READ_TIMEOUT = 60.0  # seconds a half-received body may go without a byte
HEAD_TIMEOUT = 10.0  # seconds from a request's first byte to the end of its headers
BODY_TIMEOUT = 60.0  # seconds from the end of the headers to the end of the body
MAX_CONNECTIONS = 1000  # open connections per worker (each costs a descriptor and buffers)
MAX_HEADER_BYTES = 64 << 10  # request line + headers


def worker_limits(max_body: int, error_body: Callable[[str], bytes], **overrides: Any) -> Limits:
    """A model server worker's ``Limits``: the values above unless ``overrides`` names
    others (tests shorten the deadlines)."""
    values: dict[str, Any] = {
        "head_timeout": HEAD_TIMEOUT,
        "max_head": MAX_HEADER_BYTES,
        "read_timeout": READ_TIMEOUT,
        "body_timeout": BODY_TIMEOUT,
        "keepalive_timeout": KEEPALIVE_TIMEOUT,
        "max_connections": MAX_CONNECTIONS,
    }
    values.update(overrides)
    return Limits(max_body=max_body, error_body=error_body, error_type="application/json", **values)


class FrontEnd:
    """uvicorn serving an already-bound, shared socket inside this worker through the
    HTTP layer's fast path; ``start`` returns once it accepts, ``stop`` lets requests in
    flight finish (up to ``grace`` seconds) and closes every connection."""

    def __init__(
        self,
        handler: Handler,
        max_body: int,
        error_body: Callable[[str], bytes],
        **limits: Any,
    ) -> None:
        self.limits = worker_limits(max_body, error_body, **limits)
        self.server = uvicorn_server(
            asgi_app(handler, max_body, error_body),
            self.limits,
            name="this worker",
            handler=handler,
        )
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
        sweep(self.server)
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
