"""The worker's handler as an ASGI application (the seam of the front-end A/B): requests
reach the handler whole, answers carry their status, type, length and headers, the body
limit holds for announced and streamed bodies, and a failing handler is a 500 without a
trace. Driven through ASGI's own receive/send callables."""

from __future__ import annotations

import asyncio
import json

from shipyard.serving.asgi import asgi_app
from shipyard.serving.http_types import HttpRequest, HttpResponse
from shipyard.serving.protocol import error_body

LIMIT = 100


async def handler(req: HttpRequest) -> HttpResponse:
    if req.path == "/boom":
        raise RuntimeError("kaput")
    seen = {"method": req.method, "path": req.path, "query": req.query, "body": req.body.decode()}
    seen["ctype"] = req.header("content-type")
    return HttpResponse(201, json.dumps(seen).encode(), headers=[("X-Seen", "1")])


def call(path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]] | None = None):
    app = asgi_app(handler, LIMIT, error_body)
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"a=1",
        "headers": headers or [(b"Content-Type", b"text/plain")],
    }
    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start, body = sent
    return start["status"], dict(start["headers"]), body["body"]


def test_request_reaches_the_handler_and_the_answer_is_framed():
    status, headers, body = call("/x", [b"hel", b"lo"])
    assert status == 201 and headers[b"x-seen"] == b"1"
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(body)).encode()
    seen = json.loads(body)
    assert seen == {
        "method": "POST",
        "path": "/x",
        "query": "a=1",
        "body": "hello",
        "ctype": "text/plain",
    }


def test_body_limit_announced_and_streamed_and_a_failing_handler():
    status, _, body = call("/x", [b""], [(b"content-length", str(LIMIT + 1).encode())])
    assert status == 413 and b"payload limit" in body
    status, _, body = call("/x", [b"x" * 60, b"x" * 60])
    assert status == 413 and b"payload limit" in body
    status, _, body = call("/boom", [b""])
    assert status == 500 and json.loads(body) == {"error": "internal error: RuntimeError: kaput"}
