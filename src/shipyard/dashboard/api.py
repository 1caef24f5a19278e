"""The dashboard's JSON API; the pages are built on it and nothing else.

* ``GET /api/jobs``: every job (``TrainingJobName``, ``TrainingJobStatus``, ...);
* ``GET /api/jobs/{name}``: DescribeTrainingJob's shape (datetimes as ISO strings), the
  values of its ``Environment`` hidden (where users pass secrets) unless asked for with
  ``?environment=show``;
* ``GET /api/jobs/{name}/logs?cursor=C&host=algo-k``: the log lines after cursor ``C``
  (the tail of each log without one), each ``{"label", "text"}`` (labels as
  ``shipyard logs`` prints them), the next ``cursor``, and ``more`` when unread lines
  are left (see ``logread``);
* ``GET /api/jobs/{name}/metrics``: the metric history;
* ``GET /api/jobs/{name}/utilization?cursor=C``: each instance's CPU, memory, disk,
  network and GPU samples after byte offset ``C`` (from the first without one), the
  next ``cursor`` and ``more`` (see ``usageread``);
* ``GET /api/jobs/{name}/plan?instance_type=A,B&instances=2,4``: ``shipyard plan``'s
  prediction for a finished job (see ``plan``), or ``plannable: false`` with the
  planner's message saying what the job lacks and how to get it;
* ``GET /api/jobs/{name}/logs/download?timestamps=1&format=text|json&host=&noise=1``:
  the whole log as a file, as ``shipyard logs`` prints it (hosts merged in time order);
* ``POST /api/jobs/{name}/stop``: asks a running job to stop (``shipyard stop``'s
  request; the answer does not wait for it to end), 409 for a job that has ended;
* ``POST /api/jobs/{name}/tensorboard``: starts (or finds) TensorBoard over the job's
  event files and answers its ``port`` (see ``boards``);
* ``GET /api/endpoints``: endpoints with their request counts and latency from their
  own ``/metrics``.

Everything is read from the job store and the job directories on each request: the
dashboard holds no state and may run beside jobs, the CLI and other dashboards.
"""

from __future__ import annotations

import datetime as dt
import time
import urllib.request
from typing import Any

from shipyard.control.client import ControlPlane
from shipyard.dashboard import plan as planning
from shipyard.dashboard import usageread
from shipyard.dashboard.logread import format_cursor, read_page
from shipyard.errors import ShipyardError
from shipyard.observe.logs import is_noise, select
from shipyard.observe.metrics import history

HIDDEN = "(hidden)"  # an Environment value not asked for
HOUSEKEEPING = ("/metrics", "/ping")  # not traffic: health checks and scrapes


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def jobs(control: ControlPlane, limit: int = 200) -> list[dict[str, Any]]:
    now = time.time()
    return [
        {
            "TrainingJobName": r.name,
            "TrainingJobStatus": r.status,
            "SecondaryStatus": r.secondary_status,
            "InstanceCount": r.spec.instance_count,
            "Distribution": r.spec.dist.kind,
            "CreationTime": r.created_at,
            "DurationSeconds": round((r.end_time or now) - r.created_at, 1),
        }
        for r in control.list(limit)
    ]


def job(control: ControlPlane, name: str, environment: bool = False) -> dict[str, Any]:
    """DescribeTrainingJob's answer; ``Environment`` keeps its names, its values only
    when ``environment`` (a page shows them on a click, never on a poll).

    ``Shipyard.Utilization`` is left out: a page polls this every second, and a day-long
    job's samples are megabytes (70,000 samples: a 12.7 MB answer per poll, measured);
    ``utilization()`` serves them a page at a time instead."""
    desc = control.describe(name, utilization=False)
    (desc.get("Shipyard") or {}).pop("Utilization", None)
    out = _plain(desc)
    if not environment:
        out["Environment"] = {k: HIDDEN for k in out.get("Environment") or {}}
    return out


def logs(
    control: ControlPlane,
    name: str,
    cursor: dict[str, int] | None = None,
    host: str | None = None,
    noise: bool = False,
) -> dict[str, Any]:
    """One page of a job's logs after ``cursor`` (see ``logread``): file reads, so
    the server calls it off its event loop."""
    record = control.get(name)
    page = read_page(control.log_files(name), cursor, final=record.terminal)
    lines = select(page.lines, host)
    if not noise:
        lines = [(lb, ln) for lb, ln in lines if not is_noise(ln)]
    return {
        "lines": [{"label": lb, "text": ln} for lb, ln in lines],
        "cursor": format_cursor(page.cursor),
        "more": page.more,
        "skipped": page.skipped,
        "terminal": record.terminal,
    }


class BadLogRequestError(ShipyardError):
    """A log download asked for a host the job does not have, or a format it has not."""


def log_download(
    control: ControlPlane,
    name: str,
    host: str | None = None,
    noise: bool = False,
    timestamps: bool = True,
    as_json: bool = False,
) -> tuple[str, str]:
    """(file name, text) of the whole log as ``shipyard logs [--timestamps|--json]``
    prints it: every host merged in the order the lines were written. Read whole, as
    the command reads it, so the server calls it off its event loop."""
    from shipyard.control.reading import host_names
    from shipyard.observe import logtimes

    record = control.get(name)
    hosts = host_names(record.spec_data)
    if host and host not in hosts:
        raise BadLogRequestError(
            f"job {name!r} has no host {host!r}; its hosts are {', '.join(hosts)}"
        )
    lines = logtimes.shown(
        logtimes.TimedReader(control.log_files(name)).poll(flush=True), host, noise
    )
    if as_json:
        return f"{name}.jsonl", "".join(logtimes.as_json(ln) + "\n" for ln in lines)
    return f"{name}.log", "".join(logtimes.as_text(ln, timestamps) + "\n" for ln in lines)


class JobEndedError(ShipyardError):
    """A write that needs a running job (stop) was asked of one that has ended."""


def stop(control: ControlPlane, name: str) -> dict[str, Any]:
    """Ask a running job to stop, as ``shipyard stop --no-wait`` does: the supervisor
    ends its instances and the job ends Stopped; the page's poll shows that."""
    record = control.get(name)
    if record.terminal:
        raise JobEndedError(
            f"job {name!r} has already ended ({record.status}): there is nothing to stop"
        )
    record = control.stop(name, wait=False)
    return {
        "TrainingJobName": name,
        "TrainingJobStatus": record.status,
        "SecondaryStatus": record.secondary_status,
    }


def metrics(control: ControlPlane, name: str) -> list[dict[str, Any]]:
    control.get(name)
    return history(control.store.metrics(name))


def utilization(control: ControlPlane, name: str, cursor: int = 0) -> dict[str, Any]:
    """One page of a job's utilization samples after byte ``cursor``: a file read, so
    the server calls it off its event loop."""
    record = control.get(name)
    page = usageread.read_page(usageread.path(record.job_dir), cursor)
    return {
        "samples": page.samples,
        "cursor": page.cursor,
        "more": page.more,
        "terminal": record.terminal,
    }


def plan(control: ControlPlane, name: str, query: planning.Query) -> dict[str, Any]:
    """The planner's rows for a job (raises ``PlanInputError`` with the planner's
    message when the job cannot be planned yet)."""
    return planning.predict(control.describe(name, utilization=False), query)


def _scrape(url: str) -> dict[str, float]:
    """Request count and latency totals from an endpoint's /metrics (predictions and
    other traffic; health checks and scrapes left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
        text = resp.read().decode()
    out = {"requests": 0.0, "errors": 0.0, "latency_sum": 0.0, "latency_count": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("route") in HOUSEKEEPING:
                continue
            if s.name == "shipyard_requests_total":
                out["requests"] += s.value
                if not s.labels.get("status", "2").startswith("2"):
                    out["errors"] += s.value
            elif s.name == "shipyard_request_seconds_sum":
                out["latency_sum"] += s.value
            elif s.name == "shipyard_request_seconds_count":
                out["latency_count"] += s.value
    return out


def endpoints(home: str) -> list[dict[str, Any]]:
    from shipyard.control.endpoints import Endpoints

    out = []
    for r in Endpoints(home).list():
        entry: dict[str, Any] = {
            "EndpointName": r.name,
            "EndpointStatus": r.status,
            "Url": r.url,
            "ModelData": r.model_data,
            "FailureReason": r.failure_reason,
            "At": time.time(),
        }
        if r.status == "InService":
            try:
                entry.update(_scrape(r.url))
            except Exception as exc:  # noqa: BLE001 - an endpoint that does not answer is shown so
                entry["ScrapeError"] = f"{type(exc).__name__}: {exc}"
        out.append(entry)
    return out
