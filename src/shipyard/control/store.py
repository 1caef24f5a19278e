"""The job store: SQLite in WAL mode under SHIPYARD_HOME (survives crashes, many readers).

One short-lived connection per operation keeps it safe across threads and processes
(the supervisor, the CLI and the SDK all read and write it). Every status change goes
through lifecycle.step, so an illegal transition can never be recorded, and each
change appends to the transitions table (SecondaryStatusTransitions in describe).

The tables and their versions live in control.schema. What goes in is a JobSpec and
what comes out is one again, validated on the way out: a record another shipyard
wrote in a shape this one does not understand fails loudly here, naming the job,
instead of deep inside the supervisor or describe. Readers that only show a record
(``shipyard jobs``, ``describe``, ``logs``: issue 40) ask for it unvalidated
(``validate=False``) and read ``spec_data``, the spec as stored, so that they start
without building a JobSpec; ``record.spec`` still validates on first use.
"""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, cast

from shipyard.control import schema
from shipyard.control.lifecycle import (
    Event,
    InstanceStatus,
    JobState,
    JobStatus,
    SecondaryStatus,
    step,
)
from shipyard.errors import CorruptRecordError, JobExistsError, JobNotFoundError

if TYPE_CHECKING:  # imported where a record is validated (shipyard.spec_model's rules)
    from shipyard.spec import JobSpec


class Transition(TypedDict):
    """One row of SecondaryStatusTransitions."""

    status: str
    secondary_status: str
    message: str | None
    at: float


class Attempt(TypedDict):
    attempt: int
    failure_reason: str | None
    started_at: float | None
    ended_at: float | None


class MetricPoint(TypedDict):
    name: str
    value: float
    at: float
    host: str | None


@dataclass
class JobRecord:
    name: str
    spec_json: str  # the spec as stored (JobSpec.model_dump_json)
    hyperparameters: dict[str, str]
    status: JobStatus
    secondary_status: SecondaryStatus
    failure_reason: str | None
    created_at: float
    start_time: float | None
    end_time: float | None
    modified_at: float
    job_dir: str
    backend: str
    subnet: str | None
    supervisor_pid: int | None
    stop_requested: bool
    attempt: int
    model_artifact: str | None
    output_artifact: str | None
    # when the supervising process started (its pid may be reused once it is gone)
    supervisor_started: float | None = None
    _spec: JobSpec | None = field(default=None, repr=False, compare=False)
    _spec_data: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def spec(self) -> JobSpec:
        """The validated JobSpec (validated when the record was read, or here on first use
        for a record read with ``validate=False``): CorruptRecordError if it does not."""
        if self._spec is None:
            self._spec = _validated_spec(self.name, self.spec_json)
        return self._spec

    @property
    def spec_data(self) -> dict[str, Any]:
        """The spec as stored, plain JSON (every field, defaults included: it was dumped
        from a JobSpec), for readers that only show it and so never validate it."""
        if self._spec_data is None:
            self._spec_data = cast(dict[str, Any], json.loads(self.spec_json))
        return self._spec_data

    @property
    def state(self) -> JobState:
        return JobState(self.status, self.secondary_status)

    @property
    def terminal(self) -> bool:
        return self.state.terminal


@dataclass
class InstanceRecord:
    job: str
    attempt: int
    host: str
    address: str | None
    pid: int | None
    status: InstanceStatus
    exit_code: int | None
    failure_reason: str | None
    log_path: str | None
    started_at: float | None
    ended_at: float | None


# connections a forked child inherited from its parent (``Store._connection``)
_INHERITED: builtins.list[sqlite3.Connection] = []


class Store:
    """The job records. Each thread keeps one connection for as long as the store lives:
    opening one per transaction cost 2 ms per write (the last connection's close
    checkpoints and deletes the WAL, the next open makes it again), about 30 of them on a
    4-instance job's way from submit to its end, on the critical path of every launch.
    A forked child opens its own (a connection must not cross a fork)."""

    def __init__(self, path: str) -> None:
        self.path = path
        schema.open_db(path)
        self._local = threading.local()

    def _connection(self) -> sqlite3.Connection:
        held = getattr(self._local, "db", None)
        if held is not None:
            if held[0] == os.getpid():
                return held[1]
            # a parent's, inherited through a fork: neither used nor closed here (its
            # close could checkpoint the parent's WAL); kept referenced for good
            _INHERITED.append(held[1])
        db = schema.open_connection(self.path)
        self._local.db = (os.getpid(), db)
        return db

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        yield self._connection()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with schema.immediate(self._connection()) as db:
            yield db

    # -- jobs ---------------------------------------------------------------------------
    def create_job(
        self,
        spec: JobSpec,
        hyperparameters: dict[str, str],
        job_dir: str,
        backend: str,
        subnet: str | None | Callable[[set[str]], str],
        owner_pid: int | None = None,
    ) -> JobRecord:
        """Record a new job, or JobExistsError: the name check and the insert are one
        transaction, so of concurrent submits exactly one wins (``ControlPlane.submit``
        calls this *before* staging: the name is reserved first). ``subnet`` may be a
        chooser given the subnets in use, called inside the same transaction so two jobs
        never pick the same one. ``owner_pid``: the process staging the job (reconcile
        fails the job if it dies before a supervisor takes over)."""
        name = spec.job_name
        now = time.time()
        with self._tx() as db:
            if db.execute("SELECT 1 FROM jobs WHERE name=?", (name,)).fetchone():
                raise JobExistsError(
                    f"a training job named {name!r} already exists; job names are unique: "
                    "pass another job_name or base_job_name"
                )
            if callable(subnet):
                subnet = subnet(_subnets_in_use(db))
            db.execute(
                "INSERT INTO jobs (name, spec, hyperparameters, status, secondary_status,"
                " created_at, modified_at, job_dir, backend, subnet, supervisor_pid,"
                " supervisor_started) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    name,
                    spec.model_dump_json(),
                    json.dumps(hyperparameters),
                    JobStatus.IN_PROGRESS,
                    SecondaryStatus.STARTING,
                    now,
                    now,
                    job_dir,
                    backend,
                    subnet,
                    owner_pid,
                    process_started(owner_pid),
                ),
            )
            db.execute(
                "INSERT INTO transitions VALUES (?,?,?,?,?)",
                (
                    name,
                    JobStatus.IN_PROGRESS,
                    SecondaryStatus.STARTING,
                    "Preparing the instances for training",
                    now,
                ),
            )
        return self.get(name)

    def delete_job(self, name: str) -> None:
        """Forget a job entirely: a submission refused after its name was reserved."""
        with self._tx() as db:
            for table in ("jobs",):
                db.execute(f"DELETE FROM {table} WHERE name=?", (name,))
            for table in ("transitions", "instances", "attempts", "metrics"):
                db.execute(f"DELETE FROM {table} WHERE job=?", (name,))

    def exists(self, name: str) -> bool:
        with self._connect() as db:
            return db.execute("SELECT 1 FROM jobs WHERE name=?", (name,)).fetchone() is not None

    def get(self, name: str, validate: bool = True) -> JobRecord:
        """The job's record, its spec validated (``validate=False``: on first use of
        ``record.spec``; ``record.spec_data`` reads it as stored)."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE name=?", (name,)).fetchone()
        if row is None:
            raise JobNotFoundError(f"no training job named {name!r} (see `shipyard jobs`)")
        return _job(row, validate)

    def list(self, limit: int = 100, validate: bool = True) -> builtins.list[JobRecord]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        return [_job(r, validate) for r in rows]

    def subnets_in_use(self) -> set[str]:
        with self._connect() as db:
            return _subnets_in_use(db)

    def transition(
        self, name: str, event: Event, message: str = "", failure_reason: str | None = None
    ) -> JobRecord:
        """Apply a lifecycle event atomically; returns the updated record."""
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT status, secondary_status, start_time FROM jobs WHERE name=?", (name,)
            ).fetchone()
            if row is None:
                raise JobNotFoundError(f"no training job named {name!r}")
            new = step(JobState(row["status"], row["secondary_status"]), event)
            fields = {"status": new.status, "secondary_status": new.secondary, "modified_at": now}
            if new.secondary is SecondaryStatus.TRAINING and row["start_time"] is None:
                fields["start_time"] = now
            if new.terminal:
                fields["end_time"] = now
            if failure_reason is not None:
                fields["failure_reason"] = failure_reason
            sets = ", ".join(f"{k}=?" for k in fields)
            db.execute(f"UPDATE jobs SET {sets} WHERE name=?", (*fields.values(), name))
            db.execute(
                "INSERT INTO transitions VALUES (?,?,?,?,?)",
                (name, new.status, new.secondary, message, now),
            )
        return self.get(name)

    def update(self, name: str, **fields: Any) -> None:
        allowed = {
            "hyperparameters",
            "supervisor_pid",
            "supervisor_started",
            "stop_requested",
            "attempt",
            "model_artifact",
            "output_artifact",
            "failure_reason",
        }
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"cannot update {bad}")
        if "supervisor_pid" in fields and "supervisor_started" not in fields:
            fields["supervisor_started"] = process_started(fields["supervisor_pid"])
        if "hyperparameters" in fields:
            fields["hyperparameters"] = json.dumps(fields["hyperparameters"])
        fields["modified_at"] = time.time()
        sets = ", ".join(f"{k}=?" for k in fields)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE name=?", (*fields.values(), name))

    def request_stop(self, name: str) -> JobRecord:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET stop_requested=1, modified_at=? WHERE name=?", (time.time(), name)
            )
        return self.get(name)

    def transitions(self, name: str) -> builtins.list[Transition]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT status, secondary_status, message, at FROM transitions"
                " WHERE job=? ORDER BY rowid",
                (name,),
            ).fetchall()
        return [cast(Transition, dict(r)) for r in rows]

    # -- instances and attempts ---------------------------------------------------------
    def record_instance(self, rec: InstanceRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO instances VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rec.job,
                    rec.attempt,
                    rec.host,
                    rec.address,
                    rec.pid,
                    rec.status,
                    rec.exit_code,
                    rec.failure_reason,
                    rec.log_path,
                    rec.started_at,
                    rec.ended_at,
                ),
            )

    def record_instances(self, recs: builtins.list[InstanceRecord]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO instances VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        r.job,
                        r.attempt,
                        r.host,
                        r.address,
                        r.pid,
                        r.status,
                        r.exit_code,
                        r.failure_reason,
                        r.log_path,
                        r.started_at,
                        r.ended_at,
                    )
                    for r in recs
                ],
            )

    def close_running_instances(self, name: str, status: InstanceStatus, reason: str | None) -> int:
        """Instances still recorded Running whose supervisor is gone: give them their end
        (``status``, now); returns how many rows changed."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE instances SET status=?, failure_reason=COALESCE(failure_reason, ?),"
                " ended_at=? WHERE job=? AND status=?",
                (status, reason, time.time(), name, InstanceStatus.RUNNING),
            )
            return int(cur.rowcount)

    def instances(self, name: str, attempt: int | None = None) -> builtins.list[InstanceRecord]:
        with self._connect() as db:
            if attempt is None:
                rows = db.execute(
                    "SELECT * FROM instances WHERE job=? ORDER BY attempt, host", (name,)
                ).fetchall()
            else:
                rows = db.execute(
                    "SELECT * FROM instances WHERE job=? AND attempt=? ORDER BY host",
                    (name, attempt),
                ).fetchall()
        recs = [InstanceRecord(**dict(r, status=InstanceStatus(r["status"]))) for r in rows]
        return sorted(recs, key=lambda r: (r.attempt, _host_index(r.host)))

    def record_attempt(
        self,
        name: str,
        attempt: int,
        started_at: float,
        ended_at: float | None = None,
        failure_reason: str | None = None,
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?)",
                (name, attempt, failure_reason, started_at, ended_at),
            )

    def attempts(self, name: str) -> builtins.list[Attempt]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT attempt, failure_reason, started_at, ended_at FROM attempts"
                " WHERE job=? ORDER BY attempt",
                (name,),
            ).fetchall()
        return [cast(Attempt, dict(r)) for r in rows]

    # -- metrics --------------------------------------------------------------------------
    def add_metrics(self, name: str, points: builtins.list[tuple[str, float, float, str]]) -> None:
        if not points:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO metrics VALUES (?,?,?,?,?)",
                [(name, m, v, t, h) for (m, v, t, h) in points],
            )

    def metrics(self, name: str) -> builtins.list[MetricPoint]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT name, value, at, host FROM metrics WHERE job=? ORDER BY rowid", (name,)
            ).fetchall()
        return [cast(MetricPoint, dict(r)) for r in rows]


def _host_index(host: str) -> int:
    try:
        return int(host.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def _job(row: sqlite3.Row, validate: bool = True) -> JobRecord:
    data = dict(row)
    data["spec_json"] = data.pop("spec")
    try:
        data["hyperparameters"] = json.loads(data["hyperparameters"])
        data["status"] = JobStatus(data["status"])
        data["secondary_status"] = SecondaryStatus(data["secondary_status"])
    except ValueError as exc:
        raise _corrupt(data["name"], str(exc)) from None
    data["stop_requested"] = bool(data["stop_requested"])
    record = JobRecord(**data)
    if validate:
        record._spec = _validated_spec(record.name, record.spec_json)
    return record


def _validated_spec(name: str, spec_json: str) -> JobSpec:
    from shipyard.spec import JobSpec
    from shipyard.spec_model import SpecValidationError

    try:
        return JobSpec.model_validate_json(spec_json)
    except SpecValidationError as exc:
        if exc.errors():
            err = exc.errors()[0]
            raise _corrupt(
                name, f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}"
            ) from None
        raise _corrupt(name, str(exc)) from None


def _corrupt(name: str, why: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"the stored record of training job {name!r} does not read back as a "
        f"valid job ({why}); it was written by an incompatible shipyard or "
        "edited by hand: run this job again under another name"
    )


def _subnets_in_use(db: sqlite3.Connection) -> set[str]:
    rows = db.execute(
        "SELECT subnet FROM jobs WHERE status IN (?,?) AND subnet IS NOT NULL",
        (JobStatus.IN_PROGRESS, JobStatus.STOPPING),
    ).fetchall()
    return {r["subnet"] for r in rows}


def process_started(pid: int | None) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None if it is gone: with
    the pid, the identity of a process across pid reuse."""
    if pid is None:
        return None
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None
