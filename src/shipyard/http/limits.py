"""The limits a server facing clients needs that uvicorn lacks of its own.

No field has a default: the API server and a model server's worker differ on purpose
(a notebook uploading to S3 over a slow link vs. an inference client that either sends
in time or is a slowloris), so each caller names every value where it builds its
``Limits`` and nothing changes under it when another caller's needs do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def plain_text(message: str) -> bytes:
    """A refusal's body as the API server sends it: the message itself."""
    return message.encode()


@dataclass(frozen=True)
class Limits:
    """One connection's limits, enforced by ``protocol.GuardedProtocol``."""

    head_timeout: float  # a whole request line + headers, from its first byte -> 408
    max_head: int  # their size, counted as the bytes arrive -> 431
    read_timeout: float  # a body with no byte for this long while awaited -> close
    body_timeout: float | None  # a whole body, from the end of its head -> 408 (None: none)
    keepalive_timeout: float  # an idle connection (also one that never sent) -> close
    max_connections: int  # open connections; more are answered 503 and closed
    max_body: int | None  # a body over this -> 413 before it is read (None: the app decides)
    error_body: Callable[[str], bytes] = plain_text  # a refusal's body from its message
    error_type: str = "text/plain"  # ... and its content type
