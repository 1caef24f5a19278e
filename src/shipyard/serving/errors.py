"""Errors of the model server. Each carries the HTTP status it is answered with.

Messages are what the client reads in ``{"error": "..."}``: they say what was wrong
and never hold a stack trace.

    ServingError (ShipyardError)
    ├── RequestError            a request the server refuses (status 4xx)
    │   ├── BadRequest          400 malformed body, wrong shape or dtype
    │   ├── NotFound            404 no such model / version / signature
    │   ├── PayloadTooLarge     413 body over the payload limit
    │   └── UnsupportedMediaType 415 content type or accept not handled
    ├── ModelLoadError          the model directory cannot be served (refused at load)
    └── HandlerError            the user's inference.py raised (500, its message only;
                                a RecursionError there is a BadRequest: input nested
                                too deeply)
"""

from __future__ import annotations

from shipyard.errors import ShipyardError


class ServingError(ShipyardError):
    status = 500


class RequestError(ServingError):
    status = 400


class BadRequest(RequestError):
    status = 400


class NotFound(RequestError):
    status = 404


class PayloadTooLarge(RequestError):
    status = 413


class UnsupportedMediaType(RequestError):
    status = 415


class ModelLoadError(ServingError):
    """The model cannot be loaded; the endpoint is Failed with this message."""


class HandlerError(ServingError):
    status = 500
