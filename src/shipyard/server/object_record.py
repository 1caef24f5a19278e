"""An object as the store's index holds it (split from :mod:`shipyard.server.objects` so
that the multipart half of the store, ``object_uploads``, names it without importing the
store)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Obj:
    bucket: str
    key: str
    file: str
    size: int
    etag: str
    modified: float
    content_type: str | None
    meta: dict[str, str]
