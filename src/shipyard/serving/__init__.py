"""shipyard.serving: the model server (SageMaker hosting protocol + TF Serving REST API).

A layer of its own: it reads model artifacts (a directory or model.tar.gz) and never
imports the training side (sdk, control, backends, agent). ``python -m shipyard.serving``
runs a server; control/endpoints.py starts one per endpoint as a detached process.

    model_data.py   safe extraction of model.tar.gz, TF Serving model discovery
    protocol.py     request/response conversions (SageMaker TFS container, TFS REST)
    servables.py    loaded models: TF SavedModel signatures, PyTorch modules
    user_module.py  inference.py contracts (TF handlers, model_fn/input_fn/...)
    service.py      one model directory served: routing of invocations and TFS calls
    batching.py     dynamic batching of concurrent requests into one model call
    http_types.py   HttpRequest / HttpResponse (shipyard.http's): the handler seam below HTTP
    asgi.py         that handler as an ASGI application
    front_end.py    a worker's limits on shipyard.http's uvicorn adapter (fast path)
    app.py          the routes (SageMaker hosting, TF Serving REST), errors as {"error": ...}
    server.py       master process: socket, worker processes, state file
    worker.py       one worker process
    config.py       the server's settings (workers, batching, limits) from SHIPYARD_SERVING_CONFIG
    errors.py       ServingError and its HTTP statuses
    fast_json.py    JSON bodies of plain arrays, decoded without the json module's objects
    prometheus.py   /metrics: requests by route and status, across workers
    transform/      batch transform: records.py (split, group, filter, join: pure) and
                    engine.py (mini-batched requests to a running server, atomic outputs)
"""
