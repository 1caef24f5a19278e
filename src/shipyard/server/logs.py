"""CloudWatch Logs, read-only: each host's log file as a log stream.

Groups as SageMaker names them: ``/aws/sagemaker/TrainingJobs`` (stream
``<job>/algo-<k>-<created>``), ``/aws/sagemaker/Endpoints/<endpoint>`` and
``/aws/sagemaker/TransformJobs`` (stream ``<name>/<name>``). Requests are validated
against botocore's model of the logs service (contract.py) before they are read. The SDK's ``logs_for_job``
resumes a stream by (timestamp, events to skip), so every line keeps the timestamp it
was given when first read: ``_Stream`` indexes each file's lines (offset, time) as it grows.
That time is when the line was written, from the log's ``.times`` sidecar (the times
``shipyard logs --timestamps`` shows, ``observe.logtimes``); a line the sidecar does not
yet hold takes the file's modification time. Before, every line took the moment the server
first read it, so a server started after a job ended stamped the whole log with one time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from shipyard.observe.logs import hidden_raw_line
from shipyard.observe.logtimes import TimeIndex
from shipyard.runtime import safepath
from shipyard.server.contract import Contract, unknown_operation
from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, json_response

TRAINING = "/aws/sagemaker/TrainingJobs"
TRANSFORM = "/aws/sagemaker/TransformJobs"
ENDPOINTS = "/aws/sagemaker/Endpoints/"
MAX_EVENTS = 10000


class _Stream:
    """One log file's lines, each with the time it was written (ms), fixed when first read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: list[tuple[int, int, int]] = []  # (timestamp ms, offset, length)
        self.read_to = 0
        self.last = 0  # timestamps never go back within a stream (the SDK resumes by them)
        self.times = TimeIndex(path)
        self.lock = threading.Lock()

    def refresh(self) -> None:
        with self.lock:
            try:
                stat = os.stat(self.path)
            except OSError:
                return
            if stat.st_size <= self.read_to:
                return
            unnoted = int(min(stat.st_mtime, time.time()) * 1000)
            with safepath.open_record(self.path, "rb") as fh:  # a link: refused
                fh.seek(self.read_to)
                data = fh.read(stat.st_size - self.read_to)
            self.times.refresh()
            offset = self.read_to
            while True:
                cut = data.find(b"\n")
                if cut < 0:
                    break  # a partial last line waits for its newline
                written = self.times.time_of(offset + cut + 1)
                at = unnoted if written is None else int(written * 1000)
                self.last = max(self.last, at)
                self.lines.append((self.last, offset, cut))
                offset += cut + 1
                data = data[cut + 1 :]
            self.read_to = offset

    def events(self, start_time: int, first: int) -> tuple[list[dict[str, Any]], int]:
        self.refresh()
        out: list[dict[str, Any]] = []
        index = first
        with safepath.open_record(self.path, "rb") as fh:
            while index < len(self.lines) and len(out) < MAX_EVENTS:
                ts, offset, length = self.lines[index]
                index += 1
                if ts < start_time:
                    continue
                fh.seek(offset)
                message = fh.read(length).decode("utf-8", "replace")
                if hidden_raw_line(message):  # framework noise, as `shipyard logs` hides it
                    continue
                out.append({"timestamp": ts, "message": message, "ingestionTime": ts})
        return out, index


class LogsApi:
    """``streams(group, prefix)`` gives {stream name: log file path} for a group."""

    def __init__(self, streams: Callable[[str, str], dict[str, str]]) -> None:
        self._streams = streams
        self._open: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self.contract = Contract("logs", {"DescribeLogStreams", "GetLogEvents"})

    def _stream(self, path: str) -> _Stream:
        with self._lock:
            if path not in self._open:
                self._open[path] = _Stream(path)
            return self._open[path]

    def handle(self, req: Request) -> Response:
        action = req.headers.get("x-amz-target", "").partition(".")[2]
        if action not in self.contract.operations:
            err = unknown_operation("CloudWatch Logs", action)
            err.message += "; served: DescribeLogStreams, GetLogEvents"
            raise err
        body = req.json()
        self.contract.validate(action, body)
        if action == "DescribeLogStreams":
            return json_response(self.describe_log_streams(body))
        return json_response(self.get_log_events(body))

    def describe_log_streams(self, body: dict[str, Any]) -> dict[str, Any]:
        group = body.get("logGroupName", "")
        prefix = body.get("logStreamNamePrefix", "")
        found = self._streams(group, prefix)
        streams = []
        for name in sorted(found, reverse=bool(body.get("descending"))):
            path = found[name]
            try:
                stat = os.stat(path)
            except OSError:
                continue
            stream = self._stream(path)
            stream.refresh()
            first = stream.lines[0][0] if stream.lines else int(stat.st_mtime * 1000)
            last = stream.lines[-1][0] if stream.lines else first
            streams.append(
                {
                    "logStreamName": name,
                    "creationTime": int(stat.st_ctime * 1000),
                    "firstEventTimestamp": first,
                    "lastEventTimestamp": last,
                    "lastIngestionTime": last,
                    "storedBytes": stat.st_size,
                }
            )
        return {"logStreams": streams[: int(body.get("limit") or 50)]}

    def get_log_events(self, body: dict[str, Any]) -> dict[str, Any]:
        group = body.get("logGroupName", "")
        name = body.get("logStreamName", "")
        path = self._streams(group, name).get(name)
        if path is None or not os.path.exists(path):
            raise ApiError(
                "ResourceNotFoundException",
                f"The specified log stream does not exist: {group} {name}",
            )
        token = body.get("nextToken") or "f/0"
        try:
            first = int(token.split("/", 1)[1])
        except (IndexError, ValueError):
            raise ApiError(
                "InvalidParameterException", f"nextToken {token!r} is not valid"
            ) from None
        events, index = self._stream(path).events(int(body.get("startTime") or 0), first)
        return {"events": events, "nextForwardToken": f"f/{index}", "nextBackwardToken": "b/0"}
