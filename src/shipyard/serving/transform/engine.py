"""Batch transform's engine: send each input file's records to a model server in
mini-batches and write ``<output>/<relative path>.out`` in record order, atomically.

The SDK's ``Transformer`` (and ``shipyard server``'s CreateTransformJob) start the model
server and call ``run``; everything here talks only to that server over HTTP and to
storage. ``max_concurrent`` requests are in flight at once. A mini-batch the server
refuses is retried record by record, so only the bad records fail: each is reported
with its file and 1-based position, its output line left empty (with
``assemble_with='Line'``), and the rest still processed.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shipyard.errors import ShipyardError, ValidationError
from shipyard.serving.transform import records as records_mod
from shipyard.storage.uri import local_path


@dataclass(frozen=True)
class Settings:
    """The Transformer's knobs that shape requests and outputs."""

    strategy: str | None
    max_payload_mb: float
    accept: str | None
    assemble_with: str | None


class TransformError(ShipyardError):
    """Some records failed; ``result.failures`` says which (file, position, message)."""

    def __init__(self, result: TransformResult) -> None:
        self.result = result
        shown = "; ".join(
            f"{f['File']} record {f['Position']}: {f['Error']}" for f in result.failures[:5]
        )
        more = len(result.failures) - 5
        super().__init__(
            f"batch transform {result.job_name}: {len(result.failures)} record(s) "
            f"failed ({shown}{f'; and {more} more' if more > 0 else ''}); the "
            f"other {result.records - len(result.failures)} were written"
        )


@dataclass
class TransformResult:
    job_name: str
    outputs: list[str] = field(default_factory=list)
    records: int = 0
    requests: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)


def input_files(data: str) -> list[tuple[str, Callable[[], bytes]]]:
    """(path relative to the input's "directory", reader) for each input: a file, a
    directory or a path prefix (S3Prefix semantics), local, file:// or s3://."""
    if data.startswith("s3://"):
        from shipyard.storage import list_channel, parse, store_for

        store = store_for(parse(data))
        return [
            (obj.relative, functools.partial(_read_store, store, obj.location))
            for obj in list_channel(data)
        ]
    path = local_path(data)
    if os.path.isfile(path):
        return [(os.path.basename(path), lambda: _read_file(path))]
    if os.path.isdir(path):
        base, prefix = path, ""
    else:
        base, prefix = os.path.dirname(path), os.path.basename(path)
    files: list[tuple[str, Callable[[], bytes]]] = []
    if os.path.isdir(base):
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, base)
                if rel.startswith(prefix):
                    files.append((rel, functools.partial(_read_file, full)))
    if not files:
        raise ValidationError(f"transform data {data!r} matches no file")
    return files


def _read_store(store: Any, location: Any) -> bytes:
    return _read_all(store.open(location))


def _read_file(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _read_all(stream: Any) -> bytes:
    with stream:
        return stream.read()


class Client:
    """One kept-alive connection per thread to the transform's server."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self.local = threading.local()

    def post(self, body: bytes, content_type: str, accept: str) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPConnection(*self.address, timeout=600)
                conn.connect()
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.local.conn = conn
            try:
                conn.request(
                    "POST",
                    "/invocations",
                    body=body,
                    headers={"Content-Type": content_type, "Accept": accept},
                )
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def run(
    job: str,
    files: list[tuple[str, Callable[[], bytes]]],
    host: str,
    port: int,
    output_path: str,
    staging_dir: str,
    concurrency: int,
    settings: Settings,
    options: dict[str, Any],
) -> TransformResult:
    """Transform every file through the server at ``host:port``. Outputs go to
    ``output_path`` (local or s3://; remote outputs are written under ``staging_dir``
    first, then uploaded)."""
    result = TransformResult(job)
    client = Client(host, port)
    remote = output_path.startswith("s3://")
    out_dir = staging_dir if remote else local_path(output_path)
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        for rel, read in files:
            out = os.path.join(out_dir, rel + ".out")
            transform_file(settings, rel, read(), out, client, pool, options, result)
            if remote:
                from shipyard.storage import parse, store_for

                dest = parse(output_path).child(rel + ".out")
                store_for(dest).upload(out, dest)
                result.outputs[-1] = dest.uri
    return result


def transform_file(
    settings: Settings,
    rel: str,
    data: bytes,
    out_path: str,
    client: Client,
    pool: ThreadPoolExecutor,
    options: dict[str, Any],
    result: TransformResult,
) -> None:
    split_type = options["split_type"]
    ctype = options["content_type"]
    accept = settings.accept or "application/json"
    originals = records_mod.split_records(data, split_type)
    # requests carry the filtered records; join_source joins the original ones
    records = [records_mod.filter_input(r, options["input_filter"], ctype) for r in originals]
    ranges = records_mod.mini_batches(
        records, settings.strategy, int(settings.max_payload_mb * 1024 * 1024), split_type
    )
    per_record = bool(options["join_source"] or options["output_filter"])
    lock = threading.Lock()

    def run(span: tuple[int, int]) -> list[bytes | None]:
        """Outputs of records [start, end): a list of one body, or one per record."""
        start, end = span
        status, body = client.post(
            records_mod.join_payload(records[start:end], split_type), ctype, accept
        )
        with lock:
            result.requests += 1
        if status < 300 and not per_record:
            return [body]
        if status < 300:
            split = records_mod.per_record_outputs(body, end - start)
            if split is not None:
                return list[bytes | None](split)
            if end - start == 1:
                return [body]
            status, body = (
                400,
                json.dumps(
                    {
                        "error": "the answer for a mini-batch cannot "
                        "be split per record; use an accept type "
                        "with one line per record"
                    }
                ).encode(),
            )
        if end - start > 1:  # find the bad records; the others still get outputs
            return [o for i in range(start, end) for o in run((i, i + 1))]
        with lock:
            result.failures.append(
                {
                    "File": rel,
                    "Position": start + 1,
                    "Status": status,
                    "Error": _error_text(body),
                }
            )
        return [None]

    outputs = list(pool.map(run, ranges))
    result.records += len(records)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out_path), suffix=".tmp")
    line = settings.assemble_with == "Line"
    try:
        with os.fdopen(fd, "wb") as fh:
            for (start, _end), bodies in zip(ranges, outputs):
                for k, body in enumerate(bodies):
                    body = body if body is not None else b""
                    if per_record and body:
                        body = records_mod.join_output(
                            originals[start + k],
                            body,
                            options["join_source"],
                            options["output_filter"],
                            ctype,
                            accept,
                        )
                    fh.write(body)
                    if line and not body.endswith(b"\n"):
                        fh.write(b"\n")
        os.replace(tmp, out_path)
    except BaseException:
        os.unlink(tmp)
        raise
    result.outputs.append(out_path)


def _error_text(body: bytes) -> str:
    try:
        data = json.loads(body)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return body.decode("utf-8", "replace")[:500]
