"""The worker's ``handler(HttpRequest) -> HttpResponse`` as an ASGI application: what
uvicorn serves in a worker (``front_end.py``), and what granian serves in the front-end
A/B of ``benchmarks/serving.py``; the model, routes and batching are the same objects
either way.

The body limit is also enforced here as the body arrives (413 once it is crossed, from
the announced length when there is one), for ASGI servers other than ``front_end.py``'s,
which refuses such a body before it reaches the application.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shipyard.serving.http_types import HttpRequest, HttpResponse

log = logging.getLogger("shipyard.serving")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def asgi_app(
    handler: Handler, max_body: int, error_body: Callable[[str], bytes]
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI 3 application answering every HTTP request through ``handler``."""

    async def answer(send: Send, response: HttpResponse) -> None:
        headers = [
            (b"content-type", response.content_type.encode("latin-1")),
            (b"content-length", b"%d" % len(response.body)),
        ]
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})

    def too_large(what: str) -> HttpResponse:
        return HttpResponse(
            413,
            error_body(f"{what} is over the payload limit of {max_body} bytes (MaxPayloadInMB)"),
        )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body:
            await answer(send, too_large(f"body of {length} bytes"))
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                await answer(send, too_large("body"))
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        request = HttpRequest(
            scope["method"],
            scope["path"],
            scope.get("query_string", b"").decode("latin-1"),
            headers,
            chunks[0] if len(chunks) == 1 else b"".join(chunks),
        )
        try:
            response = await handler(request)
        except Exception as exc:  # the handler should not raise; never a trace either way
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = HttpResponse(500, error_body(f"internal error: {type(exc).__name__}: {exc}"))
        await answer(send, response)

    return app
