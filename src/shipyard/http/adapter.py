"""The one place a ``uvicorn.Config`` is built, and the once-a-second sweep that enforces
``Limits``' deadlines: every shipyard server gets the same uvicorn settings (no access
log, no proxy-header middleware per request, ``server: shipyard``, no websockets) and the
same protocol, differing only in what it passes here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Literal

from shipyard.http.limits import Limits
from shipyard.http.protocol import GuardedProtocol
from shipyard.http.types import Handler
from shipyard.http.version import check_uvicorn


def uvicorn_server(
    app: Any,
    limits: Limits,
    *,
    name: str,
    handler: Handler | None = None,
    backlog: int = 2048,
    shutdown_grace: float = 10.0,
    lifespan: Literal["auto", "on", "off"] = "off",
    host: str = "127.0.0.1",
    port: int = 8000,
) -> Any:
    """A ``uvicorn.Server`` serving ``app`` (ASGI 3) through ``GuardedProtocol`` with
    ``limits``; with ``handler``, requests take the fast path to it instead of ``app``
    (which then only has to exist). ``name`` says who refuses at the connection cap;
    ``host``/``port`` are bound only when ``serve`` is given no socket."""
    import uvicorn

    check_uvicorn()
    attrs: dict[str, Any] = {"limits": limits, "name": name}
    if handler is not None:
        attrs["handler"] = staticmethod(handler)
    protocol = type("BoundGuardedProtocol", (GuardedProtocol,), attrs)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        ws="none",
        loop="none",  # the caller's loop (uvloop where installed: run() or the worker)
        lifespan=lifespan,
        interface="asgi3",
        access_log=False,
        log_config=None,
        log_level="warning",
        server_header=False,
        proxy_headers=False,  # no proxy in front: no middleware per request
        headers=[("server", "shipyard")],
        timeout_keep_alive=limits.keepalive_timeout,  # type: ignore[arg-type]
        backlog=backlog,
        timeout_graceful_shutdown=max(1, round(shutdown_grace)),
    )
    return uvicorn.Server(config)


def sweep(server: Any) -> None:
    """Tick every open connection of ``server`` (a ``uvicorn.Server``) once: the
    deadlines of ``Limits`` are counted here, not by timers re-armed per request."""
    now = time.monotonic()
    for conn in list(server.server_state.connections):
        if isinstance(conn, GuardedProtocol):
            conn.tick(now)


async def sweep_forever(server: Any) -> None:
    """``sweep`` once a second until ``server`` is told to exit."""
    while not server.should_exit:
        await asyncio.sleep(1.0)
        sweep(server)


async def serve(server: Any, sockets: list[Any] | None = None) -> None:
    """``server.serve`` (uvicorn's signal handling: SIGINT/SIGTERM let requests in flight
    finish) with the sweep running beside it."""
    ticking = asyncio.get_running_loop().create_task(sweep_forever(server))
    try:
        await server.serve(sockets=sockets)
    finally:
        ticking.cancel()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` to its end on uvloop when it is installed (Python 3.11+), else on
    asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    if uvloop is None or not hasattr(asyncio, "Runner"):  # Runner: Python 3.11+
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def install_uvloop() -> bool:
    """Use uvloop's event loop when it is installed (the serve extra has it); returns
    whether it is in use."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
