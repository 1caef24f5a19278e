"""What the server keeps beside the job store: the API's own resources.

Training jobs and endpoints are the control plane's records (``shipyard jobs`` and
``shipyard endpoints`` show them); this small SQLite file (``$SHIPYARD_HOME/server/
api.db``) holds what SageMaker has and shipyard's core does not: models, endpoint
configs, which config an endpoint runs, transform jobs, the image a job named, tags.
Each resource is one JSON document per (kind, name).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

from shipyard.server.local_db import LocalDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    kind TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (kind, name)
);
"""


class Records:
    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self._db = LocalDb(path, _SCHEMA)

    def add(self, kind: str, name: str, doc: dict[str, Any]) -> bool:
        """Insert; False when (kind, name) exists already (nothing written)."""
        with self._db() as db:
            try:
                db.execute(
                    "INSERT INTO resources VALUES (?,?,?,?)",
                    (kind, name, json.dumps(doc), time.time()),
                )
            except sqlite3.IntegrityError:
                return False
        return True

    def put(self, kind: str, name: str, doc: dict[str, Any]) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO resources VALUES (?,?,?,?) ON CONFLICT(kind, name) "
                "DO UPDATE SET doc=excluded.doc",
                (kind, name, json.dumps(doc), time.time()),
            )

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute(
                "SELECT doc FROM resources WHERE kind=? AND name=?", (kind, name)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def delete(self, kind: str, name: str) -> bool:
        with self._db() as db:
            cur = db.execute("DELETE FROM resources WHERE kind=? AND name=?", (kind, name))
        return cur.rowcount > 0

    def names(self, kind: str) -> list[str]:
        with self._db() as db:
            rows = db.execute(
                "SELECT name FROM resources WHERE kind=? ORDER BY created DESC", (kind,)
            ).fetchall()
        return [r[0] for r in rows]
