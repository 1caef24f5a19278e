"""The job store: typed records out, a versioned schema, and wave-1 files that migrate."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from shipyard.control import schema
from shipyard.control.endpoints import Endpoints, EndpointStatus
from shipyard.control.lifecycle import (
    AttemptKind,
    Event,
    InstanceStatus,
    JobStatus,
    SecondaryStatus,
)
from shipyard.control.store import CorruptRecordError, InstanceRecord, Store
from shipyard.spec import JobSpec, validated

# Verbatim: the statements wave 1 ran on every open (store.py and endpoints.py at 34c29f5),
# with no schema version.
WAVE1_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
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
);
CREATE TABLE IF NOT EXISTS instances (
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
);
CREATE TABLE IF NOT EXISTS transitions (
    job TEXT NOT NULL, status TEXT NOT NULL, secondary_status TEXT NOT NULL,
    message TEXT, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_job ON transitions(job);
CREATE TABLE IF NOT EXISTS attempts (
    job TEXT NOT NULL, attempt INTEGER NOT NULL, failure_reason TEXT,
    started_at REAL, ended_at REAL, PRIMARY KEY (job, attempt)
);
CREATE TABLE IF NOT EXISTS metrics (
    job TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, at REAL NOT NULL, host TEXT
);
CREATE INDEX IF NOT EXISTS metrics_job ON metrics(job);
CREATE TABLE IF NOT EXISTS endpoints (
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
);
"""


def _spec(name: str = "job-1") -> JobSpec:
    return validated(
        job_name=name,
        code={"entry_point": "train.py", "source_dir": "/src"},
        instance_count=2,
        hyperparameters={"lr": 0.1},
        channels=[{"name": "train", "uri": "file:///data", "input_mode": "Pipe"}],
        metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
        distribution={"kind": "torch_distributed", "options": {}},
    )


def _wave1_db(path: str, spec: JobSpec) -> None:
    """A database as wave 1 left it: its tables, one finished job, one endpoint."""
    db = sqlite3.connect(path)
    db.executescript(WAVE1_SCHEMA)
    now = time.time()
    db.execute(
        "INSERT INTO jobs (name, spec, hyperparameters, status, secondary_status,"
        " created_at, modified_at, job_dir, backend, subnet)"
        " VALUES (?,?,?,?,?,?,?,?,?,?)",
        (
            spec.job_name,
            json.dumps(spec.model_dump(mode="json")),  # how wave 1 wrote it
            json.dumps({"lr": "0.1"}),
            "Completed",
            "Completed",
            now,
            now,
            "/jobs/" + spec.job_name,
            "local",
            "127.100.1",
        ),
    )
    db.execute(
        "INSERT INTO endpoints VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        ("ep-1", "/m.tar.gz", "/eps/ep-1", "127.0.0.1", 8080, None, "Failed", "gone", "{}", 1, 1),
    )
    db.commit()
    db.close()


def test_wave1_database_opens_and_migrates(tmp_path):
    path = str(tmp_path / "shipyard.db")
    spec = _spec()
    _wave1_db(path, spec)
    with schema.connect(path) as db:
        assert schema.version(db) == 0

    store = Store(path)

    with schema.connect(path) as db:
        assert schema.version(db) == schema.VERSION
        indexes = {r["name"] for r in db.execute("SELECT name FROM sqlite_master")}
    assert {"jobs_created", "jobs_status"} <= indexes
    record = store.get(spec.job_name)
    assert isinstance(record.spec, JobSpec)
    assert record.spec == spec
    assert record.status is JobStatus.COMPLETED
    assert record.secondary_status is SecondaryStatus.COMPLETED
    assert record.terminal
    # the endpoints table (once its own schema in endpoints.py) came along
    ep = Endpoints(str(tmp_path))._row("ep-1")
    assert ep is not None and ep.status is EndpointStatus.FAILED
    # reopening is a no-op
    assert schema.open_db(path) == schema.VERSION


def test_create_and_read_back_typed(tmp_path):
    store = Store(str(tmp_path / "db"))
    spec = _spec("typed")
    store.create_job(spec, {"lr": "0.1"}, "/jobs/typed", "local", "127.100.2")
    record = store.get("typed")
    assert record.spec == spec and record.spec.channels[0].input_mode == "Pipe"
    assert record.status is JobStatus.IN_PROGRESS
    assert record.secondary_status is SecondaryStatus.STARTING
    assert store.subnets_in_use() == {"127.100.2"}
    record = store.transition("typed", Event.TRAINING)
    assert record.secondary_status is SecondaryStatus.TRAINING and record.start_time
    store.record_instance(
        InstanceRecord("typed", 1, "algo-1", None, 1, InstanceStatus.RUNNING, *[None] * 5)
    )
    assert store.instances("typed")[0].status is InstanceStatus.RUNNING
    # enums keep the stored strings and JSON exactly as before
    assert json.dumps([record.status, AttemptKind.MAX_RUNTIME]) == '["InProgress", "max_runtime"]'
    assert f"{record.status}/{record.secondary_status}" == "InProgress/Training"
    with schema.connect(store.path) as db:
        row = db.execute("SELECT status, secondary_status FROM jobs").fetchone()
    assert tuple(row) == ("InProgress", "Training")


def test_a_record_that_does_not_validate_is_refused_by_name(tmp_path):
    store = Store(str(tmp_path / "db"))
    store.create_job(_spec("bad"), {}, "/jobs/bad", "local", None)
    with schema.transaction(store.path) as db:
        db.execute("UPDATE jobs SET spec=? WHERE name='bad'", (json.dumps({"job_name": "bad"}),))
    with pytest.raises(CorruptRecordError, match=r"'bad'.*code"):
        store.get("bad")


def test_a_failing_migration_changes_nothing(tmp_path):
    path = str(tmp_path / "db")
    broken = (*schema.MIGRATIONS, ("CREATE TABLE extra (a)", "THIS IS NOT SQL"))
    with pytest.raises(sqlite3.OperationalError):
        schema.open_db(path, broken)
    with schema.connect(path) as db:
        assert schema.version(db) == 0
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_a_newer_database_is_refused(tmp_path):
    path = str(tmp_path / "db")
    Store(path)
    with schema.connect(path) as db:
        db.execute(f"PRAGMA user_version={schema.VERSION + 1}")
    with pytest.raises(schema.SchemaError, match="newer than this shipyard"):
        Store(path)


def test_many_openers_migrate_once(tmp_path):
    path = str(tmp_path / "db")
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            Store(path)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    with schema.connect(path) as db:
        assert schema.version(db) == schema.VERSION


def test_a_store_keeps_one_connection_per_thread_and_none_across_a_fork(tmp_path, monkeypatch):
    """Every transaction opened and closed its own connection: 2 ms per write (the last
    close checkpoints and deletes the WAL), about 30 on each launch's critical path."""
    import os

    opened: list[int] = []
    real = schema.open_connection

    def counting(path):
        opened.append(os.getpid())
        return real(path)

    monkeypatch.setattr(schema, "open_connection", counting)
    store = Store(str(tmp_path / "store.db"))
    opened.clear()  # opening the file (its migrations) is not a transaction
    for i in range(5):
        store.create_job(_spec(f"job-{i}"), {}, f"/jobs/{i}", "local", None)
        assert store.get(f"job-{i}").name == f"job-{i}"
    assert len(opened) == 1
    other = threading.Thread(target=lambda: store.get("job-0"))
    other.start()
    other.join()
    assert len(opened) == 2  # a thread of its own
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must not use the parent's connection
        try:
            store.create_job(_spec("from-child"), {}, "/jobs/child", "local", None)
            os.write(write, str(len(opened) - 2).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 8) == b"1"  # the child opened one of its own
    assert store.get("from-child").name == "from-child"  # and its write is seen here
