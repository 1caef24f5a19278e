"""One HTTP layer for every shipyard server (issue 36): ``shipyard server``'s API
(``server/asgi.py``), the model server's workers (``serving/front_end.py``) and the
dashboard serve through the same uvicorn adapter.

    limits.py     ``Limits``: head deadline, 431, connection cap, idle close, 413 — each
                  server passes its own values, none is implied
    version.py    the uvicorn range the protocol is written against, and the warning
    refusal.py    the one writer of a refusal (503, 408, 413, 431, 400) on a connection
    types.py      ``HttpRequest`` / ``HttpResponse``: the fast path's handler seam
    protocol.py   ``GuardedProtocol``: the one uvicorn protocol subclass (httptools);
                  ASGI by default, the model server's fast path when given a handler
    adapter.py    ``uvicorn_server``: the one ``uvicorn.Config``, and the once-a-second sweep
"""
