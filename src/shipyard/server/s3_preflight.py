"""S3's answer to ``OPTIONS``: a browser's CORS preflight, which no client signs.

S3 answers a preflight before (and without) authentication, from the bucket's CORS
configuration: 400 ``BadRequest`` "Insufficient information. Origin request header
needed." without an ``Origin``, and, with one, 403 ``AccessForbidden`` "CORSResponse: CORS
is not enabled for this bucket." where the bucket has no configuration. CORS is not served
here (no bucket has a configuration), so that is every preflight's answer. Before, an
``OPTIONS`` went through SigV4 like any request and was 403 (a presigned URL's signature
names GET), which told a caller its URL was bad rather than that it sent no Origin.
Nothing is read or written; the Host check still applies (app.py runs it first).
"""

from __future__ import annotations

from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response
from shipyard.server.s3_api import error_response


def answer(req: Request) -> Response:
    """The preflight's answer, an S3 error document (no bucket has CORS rules here)."""
    if not req.headers.get("origin"):
        err = ApiError("BadRequest", "Insufficient information. Origin request header needed.")
    else:
        err = ApiError("AccessForbidden", "CORSResponse: CORS is not enabled for this bucket.", 403)
    return error_response(err, head=False)
