"""Endpoints: model servers that outlive the process that created them.

An endpoint is a detached model server (its own session, so Ctrl-C in a notebook does
not take it down), started through ``shipyard.control.endpoint_box``: its workers, which
import the inference code, run in an instance sandbox of the endpoint's instance type, recorded in the ``endpoints`` table of
the job store's SQLite file. Its model directory lives under
``$SHIPYARD_HOME/endpoints/<name>/model``: model_data extracted safely, the inference
code (entry_point/source_dir) copied into ``model/code`` as the SageMaker SDK repacks
it, and ``code/requirements.txt`` installed in staging's cached environment. What the
workers could not be given is in describe's ``Shipyard.MissingProtections``.

The server writes its status to ``state.json``; ``get`` reconciles the record with it
and with the process (a dead server is Failed). ``delete`` stops the server and its
workers and removes everything it made. Creation that fails leaves nothing behind.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import psutil

from shipyard.control import schema, staging
from shipyard.control.home import Home
from shipyard.control.lifecycle import StrEnum
from shipyard.errors import EndpointError, EndpointNotFoundError, ValidationError
from shipyard.runtime.reaping import kill_survivors, wait_gone


class EndpointStatus(StrEnum):
    """EndpointStatus as SageMaker names the ones a local endpoint goes through."""

    CREATING = "Creating"
    IN_SERVICE = "InService"
    FAILED = "Failed"


@dataclass
class EndpointRecord:
    name: str
    model_data: str
    endpoint_dir: str
    host: str
    port: int
    pid: int | None
    status: EndpointStatus
    failure_reason: str | None
    config: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    modified_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state_file(self) -> str:
        return os.path.join(self.endpoint_dir, "state.json")

    @property
    def log_path(self) -> str:
        return os.path.join(self.endpoint_dir, "server.log")

    def describe(self) -> dict[str, Any]:
        """DescribeEndpoint's shape, with where it listens, what its workers got of the
        machine and the protections they run without."""
        extra: dict[str, Any] = {}
        state = _read_json(self.state_file)
        if state.get("missing_protections"):
            extra["MissingProtections"] = list(state["missing_protections"])
        from shipyard.backends.resources import read_record

        limits = read_record(self.endpoint_dir)
        if limits is not None:
            extra["Resources"] = limits
        return {
            "EndpointName": self.name,
            "EndpointStatus": self.status,
            "FailureReason": self.failure_reason,
            "CreationTime": self.created_at,
            "LastModifiedTime": self.modified_at,
            "Shipyard": {
                "Url": self.url,
                "Pid": self.pid,
                "ModelData": self.model_data,
                "Log": self.log_path,
                **self.config,
                **extra,
            },
        }


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Endpoints:
    def __init__(self, home: str | None = None) -> None:
        self.home = Home.from_env(home)
        self.home.ensure_private()
        self.db_path = self.home.db_path
        schema.open_db(self.db_path)

    def endpoint_dir(self, name: str) -> str:
        return os.path.join(self.home.root, "endpoints", name)

    # -- reading --------------------------------------------------------------------------
    def _row(self, name: str) -> EndpointRecord | None:
        with schema.connect(self.db_path) as db:
            row = db.execute("SELECT * FROM endpoints WHERE name=?", (name,)).fetchone()
        if row is None:
            return None
        data = dict(row)
        data["config"] = json.loads(data["config"])
        data["status"] = EndpointStatus(data["status"])
        return EndpointRecord(**data)

    def get(self, name: str) -> EndpointRecord:
        record = self._row(name)
        if record is None:
            raise EndpointNotFoundError(f"no endpoint named {name!r} (see `shipyard endpoints`)")
        return self._reconcile(record)

    def list(self) -> builtins.list[EndpointRecord]:
        with schema.connect(self.db_path) as db:
            names = [
                r["name"]
                for r in db.execute(
                    "SELECT name FROM endpoints ORDER BY created_at DESC"
                ).fetchall()
            ]
        # reconciled like get(): a server killed meanwhile must not be listed InService
        return [self._reconcile(r) for r in (self._row(n) for n in names) if r is not None]

    def _reconcile(self, record: EndpointRecord) -> EndpointRecord:
        """The server's own state file and liveness decide the status."""
        status, reason = record.status, record.failure_reason
        try:
            with open(record.state_file) as fh:
                state = json.load(fh)
            said, reason = state["status"], state.get("failure_reason") or reason
            # the server's own last word "Deleted": it stopped without being deleted here
            if said == "Deleted":
                said, reason = EndpointStatus.FAILED, reason or "the server stopped"
            status = EndpointStatus(said)
        except (OSError, ValueError, KeyError):
            pass
        if status is not EndpointStatus.FAILED and not _server_alive(record):
            status = EndpointStatus.FAILED
            reason = reason or (
                f"the server process ({record.pid}) ended unexpectedly; see {record.log_path}"
            )
            _stop_leftovers(record.endpoint_dir)
        if (status, reason) != (record.status, record.failure_reason):
            with schema.connect(self.db_path) as db:
                db.execute(
                    "UPDATE endpoints SET status=?, failure_reason=?, modified_at=? WHERE name=?",
                    (status, reason, time.time(), record.name),
                )
            record.status, record.failure_reason = status, reason
        return record

    # -- creating -------------------------------------------------------------------------
    def create(
        self,
        name: str,
        model_data: str,
        framework: str = "auto",
        entry_point: str | None = None,
        source_dir: str | None = None,
        dependencies: builtins.list[str] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        workers: int = 1,
        batch_size: int = 0,
        batch_wait_ms: float = 2.0,
        max_payload_mb: float = 6.0,
        instance_type: str | None = "local",
    ) -> EndpointRecord:
        """Prepare the model and start the detached server; returns at once (Creating).
        ``instance_type``: the sandbox its workers get (CPUs, memory, GPUs of the type)."""
        instance_type = instance_type or "local"
        from shipyard import instance_types

        instance_types.resolve(instance_type)  # an unknown type: ValidationError, before all
        self._check_new(name, host, port)
        source = self.resolve_model_data(model_data)
        edir = self._reserve_dir(name)
        model_dir = os.path.join(edir, "model")
        record: EndpointRecord | None = None
        proc: subprocess.Popen | None = None
        try:
            _stage_model(source, edir, model_dir)
            program = self._add_code(model_dir, entry_point, source_dir, dependencies or [])
            code_dir = os.path.join(model_dir, "code")
            paths = (
                staging.install_requirements(code_dir, self.home.requirements_cache)[0]
                if os.path.isdir(code_dir)
                else []
            )
            config = {
                "Framework": framework,
                "Workers": workers,
                "BatchSize": batch_size,
                "BatchWaitMs": batch_wait_ms,
                "Program": program,
                "MaxPayloadInMB": max_payload_mb,
                "InstanceType": instance_type,
            }
            record = self._insert(name, model_data, edir, host, port or free_port(host), config)
            proc = self._launch(
                record,
                instance_type,
                model_dir,
                framework,
                program,
                workers,
                batch_size,
                batch_wait_ms,
                max_payload_mb,
                env or {},
                paths,
            )
            with schema.connect(self.db_path) as db:
                db.execute("UPDATE endpoints SET pid=? WHERE name=?", (proc.pid, name))
            _wait_exec(proc, edir)
        except BaseException:
            if proc is not None:
                _stop_tree(proc.pid, grace=5)
            if record is not None:
                with schema.connect(self.db_path) as db:
                    db.execute("DELETE FROM endpoints WHERE name=?", (name,))
            shutil.rmtree(edir, ignore_errors=True)
            raise
        return self.get(name)

    def _reserve_dir(self, name: str) -> str:
        """Create the endpoint's directory, atomically: of two creates racing on one name,
        exactly one gets it, and the other leaves the winner's directory alone."""
        edir = self.endpoint_dir(name)
        os.makedirs(os.path.dirname(edir), exist_ok=True)
        try:
            os.mkdir(edir)
        except FileExistsError:
            raise ValidationError(
                f"an endpoint named {name!r} is being created or its directory {edir} "
                "already exists; pick another name or delete the endpoint"
            ) from None
        return edir

    def _check_new(self, name: str, host: str, port: int | None) -> None:
        """Refuse a bad or taken name, or a port already in use, before anything is made."""
        if not name or not all(c.isalnum() or c == "-" for c in name) or len(name) > 63:
            raise ValidationError(
                f"endpoint name {name!r}: use up to 63 letters, digits and hyphens"
            )
        if self._row(name) is not None:
            raise ValidationError(
                f"an endpoint named {name!r} already exists; delete it "
                "(`shipyard endpoints delete`) or pick another name"
            )
        if port is not None and not port_free(host, port):
            raise ValidationError(
                f"port {port} on {host} is already in use; pick another port "
                "or leave it out to get a free one"
            )

    def _insert(
        self, name: str, model_data: str, edir: str, host: str, port: int, config: dict
    ) -> EndpointRecord:
        now = time.time()
        with schema.connect(self.db_path) as db:
            db.execute(
                "INSERT INTO endpoints VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    name,
                    model_data,
                    edir,
                    host,
                    port,
                    None,
                    EndpointStatus.CREATING,
                    None,
                    json.dumps(config),
                    now,
                    now,
                ),
            )
        record = self._row(name)
        assert record is not None  # inserted just above, under our name
        return record

    def resolve_model_data(self, model_data: str) -> str:
        """A local path, file:// or s3:// URI, or a training job name -> a local archive or
        directory, or the s3:// URI of an archive that exists (fetched at creation)."""
        if "://" not in model_data and not os.path.exists(model_data):
            from shipyard.control.store import Store

            store = Store(self.db_path)
            if store.exists(model_data):
                job = store.get(model_data)
                if not job.model_artifact:
                    raise ValidationError(
                        f"training job {model_data!r} has no model artifact "
                        f"(status {job.status}); serve a Completed job"
                    )
                model_data = job.model_artifact
        if model_data.startswith("s3://"):
            from shipyard.storage import parse, store_for

            store_for(parse(model_data)).info(parse(model_data))  # refuses a missing object
            return model_data
        path = staging.local_path(model_data)
        if not os.path.exists(path):
            raise ValidationError(
                f"model_data {model_data!r} does not exist (give a "
                "model.tar.gz, a model directory or a training job name)"
            )
        return path

    @staticmethod
    def _add_code(
        model_dir: str,
        entry_point: str | None,
        source_dir: str | None,
        dependencies: builtins.list[str],
    ) -> str | None:
        """Copy the inference code into model/code (SageMaker's repack); returns program."""
        if not entry_point and not source_dir:
            return None
        code_dir = os.path.join(model_dir, "code")
        if source_dir:
            src = staging.local_path(source_dir)
            if not os.path.isdir(src):
                raise ValidationError(f"source_dir {source_dir!r} is not a directory")
            shutil.copytree(
                src,
                code_dir,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"),
            )
        if entry_point:
            path = entry_point if source_dir is None else os.path.join(code_dir, entry_point)
            if not os.path.isfile(path):
                raise ValidationError(
                    f"entry_point {entry_point!r} not found"
                    + (f" in source_dir {source_dir!r}" if source_dir else "")
                )
            if source_dir is None:
                os.makedirs(code_dir, exist_ok=True)
                shutil.copy2(path, os.path.join(code_dir, os.path.basename(path)))
                entry_point = os.path.basename(path)
        for dep in dependencies:
            dep_path = staging.local_path(dep)
            target = os.path.join(code_dir, "lib", os.path.basename(os.path.normpath(dep_path)))
            if os.path.isdir(dep_path):
                shutil.copytree(dep_path, target, dirs_exist_ok=True)
            elif os.path.isfile(dep_path):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(dep_path, target)
            else:
                raise ValidationError(f"dependency {dep!r} does not exist")
        return entry_point

    def _launch(
        self,
        record: EndpointRecord,
        instance_type: str,
        model_dir: str,
        framework: str,
        program: str | None,
        workers: int,
        batch_size: int,
        batch_wait_ms: float,
        max_payload_mb: float,
        env: dict[str, str],
        paths: builtins.list[str],
    ) -> subprocess.Popen:
        from shipyard.control import endpoint_box

        cmd = [
            sys.executable,
            "-m",
            "shipyard.control.endpoint_box",
            "--endpoint-dir",
            record.endpoint_dir,
            "--home",
            self.home.root,
            "--instance-type",
            instance_type,
            *(arg for path in paths for arg in ("--python-path", path)),
            "--",
            model_dir,
            "--port",
            str(record.port),
            "--host",
            record.host,
            "--workers",
            str(workers),
            "--framework",
            framework,
            "--max-payload-mb",
            str(max_payload_mb),
            "--batch-size",
            str(batch_size),
            "--batch-wait-ms",
            str(batch_wait_ms),
            "--state-file",
            record.state_file,
        ]
        if program:
            cmd += ["--program", program]
        # the model's environment reaches only the workers, at their last exec
        endpoint_box.write_env_file(record.endpoint_dir, dict(env, SHIPYARD_ENDPOINT=record.name))
        full_env = dict(os.environ, SHIPYARD_ENDPOINT=record.name)
        with open(record.log_path, "ab") as log:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                close_fds=True,
            )

    def wait(self, name: str, timeout: float = 600) -> EndpointRecord:
        """Until InService and /ping answers 200; EndpointError with the reason if Failed."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.get(name)
            if record.status is EndpointStatus.FAILED:
                raise EndpointError(f"endpoint {name!r} failed: {record.failure_reason}")
            if record.status is EndpointStatus.IN_SERVICE and ping(record):
                return record
            if time.monotonic() > deadline:
                raise EndpointError(
                    f"endpoint {name!r} was not InService within {timeout:.0f} s "
                    f"(status {record.status}); see {record.log_path}"
                )
            time.sleep(0.1)

    # -- deleting -------------------------------------------------------------------------
    def delete(self, name: str, grace: float = 15.0) -> None:
        """Stop the server and every worker, then forget the endpoint and its files."""
        record = self._row(name)
        if record is None:
            raise EndpointNotFoundError(f"no endpoint named {name!r} (see `shipyard endpoints`)")
        if record.pid and _server_alive(record):
            _stop_tree(record.pid, grace)
        with schema.connect(self.db_path) as db:
            db.execute("DELETE FROM endpoints WHERE name=?", (name,))
        shutil.rmtree(record.endpoint_dir, ignore_errors=True)


def _stage_model(source: str, edir: str, model_dir: str) -> None:
    """The model at ``model_dir``: an s3:// archive fetched into ``edir`` first, a
    directory copied, an archive extracted (safely: model_data refuses escaping paths)."""
    from shipyard.serving.model_data import ModelLoadError, check_tree, extract

    try:
        if source.startswith("s3://"):
            source = _download(source, os.path.join(edir, "model.tar.gz"))
        if os.path.isdir(source):
            check_tree(source)
            shutil.copytree(source, model_dir, symlinks=True)
        else:
            extract(source, model_dir)
    except ModelLoadError as exc:
        raise ValidationError(str(exc)) from None


def _wait_exec(proc: subprocess.Popen, marker: str, timeout: float = 30.0) -> None:
    """Until the forked child runs the server (between fork and exec its command line is
    still ours, and liveness checks go by the command line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if any(marker in part for part in psutil.Process(proc.pid).cmdline()):
                return
        except psutil.Error:
            pass
        time.sleep(0.01)


def _download(uri: str, dest: str) -> str:
    """An s3:// model.tar.gz, fetched through shipyard.storage (any S3 API)."""
    from shipyard.storage import parse, store_for

    loc = parse(uri)
    store = store_for(loc)
    store.download(store.info(loc), dest)
    return dest


def ping(record: EndpointRecord, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(record.url + "/ping", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def _server_alive(record: EndpointRecord) -> bool:
    """The recorded pid is still this endpoint's server (not a reused pid)."""
    if not record.pid:
        return False
    try:
        proc = psutil.Process(record.pid)
        return proc.status() != psutil.STATUS_ZOMBIE and any(
            record.endpoint_dir in part for part in proc.cmdline()
        )
    except psutil.Error:
        return False


def _stop_leftovers(endpoint_dir: str) -> None:
    """Workers of a server that died (SIGKILL leaves them running, holding the port)."""
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(endpoint_dir in part for part in proc.info.get("cmdline") or []):
                proc.terminate()
                left.append(proc)
        except psutil.Error:
            continue
    alive = wait_gone(left, timeout=3)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


def _stop_tree(pid: int, grace: float) -> None:
    """SIGTERM the server (it stops its workers), SIGKILL whatever is left after grace."""
    try:
        proc = psutil.Process(pid)
        tree = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return
    try:
        proc.send_signal(signal.SIGTERM)
    except psutil.Error:
        pass
    kill_survivors(tree, grace, settle=5)
