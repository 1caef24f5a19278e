"""The one writer of a refusal: the bytes that answer a request the server will not
serve (503 at the connection cap, 408 past a deadline, 413, 431, 400) and then end the
connection. Every server writes the same framing (its default headers, the body the
caller's ``Limits`` make from the message, ``connection: close``), so a client sees one
shape whichever shipyard server refused it."""

from __future__ import annotations

from collections.abc import Iterable

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from shipyard.http.limits import Limits


def refusal(
    status: int, message: str, limits: Limits, default_headers: Iterable[tuple[bytes, bytes]]
) -> bytes:
    """The whole answer, status line to body, for one ``transport.write``."""
    body = limits.error_body(message)
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head.append(
        b"content-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (limits.error_type.encode("latin-1"), len(body))
    )
    return b"".join(head) + body
