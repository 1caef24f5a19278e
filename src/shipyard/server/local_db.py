"""One SQLite connection per thread for the server's own small databases.

The API server answers each request on a worker thread, and a ``sqlite3.Connection`` may
only be used by the thread that opened it; opening one per request would cost more than
the request. Each thread opens its own on first use, in WAL mode (readers never wait for
the writer) with a 30 s busy timeout, and keeps it. The records of the API's resources
and the S3 index share this.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class LocalDb:
    """``with db() as conn:`` gives this thread's connection to ``path``; the schema
    (idempotent statements) is applied once, at construction."""

    def __init__(self, path: str, schema: str) -> None:
        self.path = path
        self._local = threading.local()
        with self() as conn:
            conn.executescript(schema)

    @contextmanager
    def __call__(self) -> Iterator[sqlite3.Connection]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        yield conn
