"""ASGI targets for the front-end A/B of benchmarks/serving.py, for servers that import
their application by name (granian): the same ``handler(HttpRequest) -> HttpResponse``
as a shipyard worker, through ``shipyard.serving.asgi.asgi_app``.

    granian --interface asgi serving_frontends:echo      # the echo handler, no model
    SERVING_MODEL_DIR=... granian --interface asgi serving_frontends:model

``model`` loads the model at lifespan start-up exactly as ``shipyard.serving.worker`` does
(same App, same service, batching 8 / 1 ms, the same framework threads per worker).
"""

from __future__ import annotations

import os

from shipyard.serving.asgi import asgi_app
from shipyard.serving.http_types import HttpRequest, HttpResponse
from shipyard.serving.protocol import error_body

LIMIT = 6 << 20


async def _echo(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, request.body)


echo = asgi_app(_echo, LIMIT, error_body)


def _model_app():  # type: ignore[no-untyped-def]
    from shipyard.serving.config import ServerConfig
    from shipyard.serving.worker import limit_threads

    config = ServerConfig(
        os.environ.get("SERVING_MODEL_DIR", ""),
        workers=int(os.environ.get("SERVING_WORKERS", "1")),
        batch_size=8,
        batch_wait_ms=1.0,
    )
    limit_threads(config.threads_per_worker())
    from shipyard.serving.app import App, State
    from shipyard.serving.batching import BatchingRunner
    from shipyard.serving.service import load_service

    state = State(config.max_payload_mb, config.execution_parameters())
    inner = asgi_app(App(state), state.max_payload, error_body)

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan" and state.service is None:
            runner = BatchingRunner(config.batch_size, config.batch_wait_ms / 1000)
            runner.active = lambda: state.active  # type: ignore[method-assign]
            state.service = load_service(config.model_dir, "auto", runner)
        await inner(scope, receive, send)

    return app


model = _model_app() if os.environ.get("SERVING_MODEL_DIR") else None
