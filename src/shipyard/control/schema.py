"""The one SQLite schema under SHIPYARD_HOME (jobs, instances, attempts, metrics,
transitions, endpoints), versioned with ``PRAGMA user_version``.

``MIGRATIONS[i]`` takes a database from version ``i`` to ``i + 1``. ``open_db`` applies
the pending ones in order inside one ``BEGIN IMMEDIATE`` transaction, so two processes
opening a fresh home at once (the CLI and a detached supervisor) cannot both migrate,
and a migration that fails leaves the file as it was. A database written by a newer
shipyard is refused rather than guessed at.

Version 1 is the schema wave 1 shipped without a version (``CREATE ... IF NOT EXISTS``
throughout), so a wave-1 file, at user_version 0 with some or all of those tables,
migrates like an empty one. To change the schema, append a migration: never edit one
that has shipped.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from shipyard.errors import SchemaError

_V1 = (
    """CREATE TABLE IF NOT EXISTS jobs (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        hyperparameters TEXT NOT NULL,
        status TEXT NOT NULL,
        secondary_status TEXT NOT NULL,
        failure_reason TEXT,
        created_at REAL NOT NULL,
        start_time REAL,
        end_time REAL,
        modified_at REAL NOT NULL,
        job_dir TEXT NOT NULL,
        backend TEXT NOT NULL,
        subnet TEXT,
        supervisor_pid INTEGER,
        stop_requested INTEGER NOT NULL DEFAULT 0,
        attempt INTEGER NOT NULL DEFAULT 1,
        model_artifact TEXT,
        output_artifact TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS instances (
        job TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        host TEXT NOT NULL,
        address TEXT,
        pid INTEGER,
        status TEXT NOT NULL,
        exit_code INTEGER,
        failure_reason TEXT,
        log_path TEXT,
        started_at REAL,
        ended_at REAL,
        PRIMARY KEY (job, attempt, host)
    )""",
    """CREATE TABLE IF NOT EXISTS transitions (
        job TEXT NOT NULL, status TEXT NOT NULL, secondary_status TEXT NOT NULL,
        message TEXT, at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS transitions_job ON transitions(job)",
    """CREATE TABLE IF NOT EXISTS attempts (
        job TEXT NOT NULL, attempt INTEGER NOT NULL, failure_reason TEXT,
        started_at REAL, ended_at REAL, PRIMARY KEY (job, attempt)
    )""",
    """CREATE TABLE IF NOT EXISTS metrics (
        job TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, at REAL NOT NULL, host TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS metrics_job ON metrics(job)",
    """CREATE TABLE IF NOT EXISTS endpoints (
        name TEXT PRIMARY KEY,
        model_data TEXT NOT NULL,
        endpoint_dir TEXT NOT NULL,
        host TEXT NOT NULL,
        port INTEGER NOT NULL,
        pid INTEGER,
        status TEXT NOT NULL,
        failure_reason TEXT,
        config TEXT NOT NULL,
        created_at REAL NOT NULL,
        modified_at REAL NOT NULL
    )""",
)

# `shipyard jobs` lists newest first and the planner asks for the subnets of live jobs:
# both scanned the whole jobs table.
_V2 = (
    "CREATE INDEX IF NOT EXISTS jobs_created ON jobs(created_at)",
    "CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status)",
)

# A job's supervisor is identified by its pid *and* its start time: once it is gone the
# kernel may hand the pid to another process, which must not keep the job InProgress.
_V3 = ("ALTER TABLE jobs ADD COLUMN supervisor_started REAL",)

MIGRATIONS: tuple[Sequence[str], ...] = (_V1, _V2, _V3)
VERSION = len(MIGRATIONS)


def open_connection(path: str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=True)
    try:
        _wal(db)
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=30000")
    except BaseException:
        db.close()
        raise
    db.row_factory = sqlite3.Row
    return db


@contextmanager
def connect(path: str) -> Iterator[sqlite3.Connection]:
    """One short-lived connection (``open_connection``)."""
    db = open_connection(path)
    try:
        yield db
    finally:
        db.close()


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction on ``db`` that takes the lock up front (no upgrade deadlocks)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _wal(db: sqlite3.Connection, patience: float = 30.0) -> None:
    """Switch to WAL. SQLite answers "database is locked" at once, without its busy
    handler, when another connection holds the file while the mode changes (concurrent
    first opens of a fresh database: CI once saw it in test_many_openers_migrate_once),
    so the switch is retried here for as long as ``timeout`` would have waited."""
    deadline = time.monotonic() + patience
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


@contextmanager
def transaction(path: str) -> Iterator[sqlite3.Connection]:
    """A write transaction on a short-lived connection."""
    with connect(path) as db, immediate(db) as tx:
        yield tx


def version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def open_db(path: str, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> int:
    """Bring the database at ``path`` to the latest version; returns that version."""
    latest = len(migrations)
    with connect(path) as db:
        if version(db) == latest:  # the common case takes no write lock
            return latest
    with transaction(path) as db:
        current = version(db)  # re-read under the lock: another process may have migrated
        if current > latest:
            raise SchemaError(
                f"the shipyard database {path} has schema version {current}, newer than this "
                f"shipyard understands ({latest}); upgrade shipyard, or point SHIPYARD_HOME "
                "at another directory"
            )
        for statements in migrations[current:]:
            for statement in statements:
                db.execute(statement)
        # PRAGMA takes no parameters; ``latest`` is an int we computed
        db.execute(f"PRAGMA user_version={latest:d}")
    return latest
