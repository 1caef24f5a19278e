"""The request and response a serving worker's handler sees: the HTTP layer's own
(``shipyard.http.types``), named here too because the model server's modules import
them from their package."""

from __future__ import annotations

from shipyard.http.types import Handler, HttpRequest, HttpResponse

__all__ = ["Handler", "HttpRequest", "HttpResponse"]
