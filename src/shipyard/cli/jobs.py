"""``shipyard jobs``, ``describe``, ``logs`` and ``stop``: reading jobs (added to the CLI by
register). Exit codes as in cli.app.

These read the store through ``control.reading.JobReader`` with records unvalidated (the
spec as stored, plain JSON), so none of them starts pydantic, staging or the backends
(issue 40: each command under 0.3 s of CPU).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from shipyard.cli.output import EXIT_BAD_INPUT, EXIT_NOT_FOUND, fail, out_console
from shipyard.control.lifecycle import JobStatus
from shipyard.errors import JobNotFoundError

console = Console(stderr=True, highlight=False)


def _control() -> Any:
    from shipyard.control.reading import JobReader

    reader = JobReader()
    reader.validate = False  # the spec as stored: shown, never run from here
    return reader


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def _fail(message: str, code: int) -> None:
    fail(message, code)


_COLORS = {JobStatus.COMPLETED: "green", JobStatus.FAILED: "red", JobStatus.STOPPED: "yellow"}


def jobs(
    limit: int = typer.Option(
        50, "--limit", metavar="N", help="at most this many jobs, newest first"
    ),
    status: str | None = typer.Option(
        None,
        "--status",
        metavar="STATUS",
        help="only jobs in this status: InProgress, Stopping, Completed, Failed, Stopped",
    ),
    name: str | None = typer.Option(
        None, "--name", metavar="TEXT", help="only jobs whose name contains TEXT"
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        metavar="10m|2h|1d|TIME",
        help="only jobs created since a duration ago, or an ISO 8601 time",
    ),
    as_json: bool = typer.Option(False, "--json", help="the list as JSON"),
) -> None:
    """List training jobs, newest first."""
    wanted = None
    if status is not None:
        by_lower = {s.value.lower(): s.value for s in JobStatus}
        wanted = by_lower.get(status.strip().lower().replace("_", "").replace("-", ""))
        if wanted is None:
            _fail(
                f"--status {status!r} is not a job status; one of {', '.join(by_lower.values())}",
                EXIT_BAD_INPUT,
            )
    cutoff = None
    if since is not None:
        from shipyard.observe.logtimes import parse_since

        try:
            cutoff = parse_since(since)
        except ValueError as exc:
            _fail(str(exc).replace("--since", "jobs --since"), EXIT_BAD_INPUT)
    filtering = wanted is not None or name is not None or cutoff is not None
    control = _control()
    if filtering:  # every job the name and time admit, then the status; then the limit
        records = [
            control.reconcile(r)
            for r in control.store.list(1_000_000, False)
            if (name is None or name in r.name) and (cutoff is None or r.created_at >= cutoff)
        ]
        records = [r for r in records if wanted is None or r.status == wanted][:limit]
    else:
        records = control.list(limit)
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "TrainingJobName": r.name,
                        "TrainingJobStatus": r.status,
                        "SecondaryStatus": r.secondary_status,
                        "CreationTime": r.created_at,
                    }
                    for r in records
                ],
                indent=1,
            )
        )
        return
    if not records:
        out_console().print(
            "no training jobs match these filters; `shipyard jobs` lists them all"
            if filtering
            else "no training jobs yet; start one with `shipyard train SCRIPT.py "
            "--source-dir DIR` (`shipyard train --help` shows every option)",
            highlight=False,
        )
        return
    table = Table("name", "status", "secondary", "instances", "created", "duration")
    for r in records:
        created = dt.datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S")
        duration = f"{(r.end_time or dt.datetime.now().timestamp()) - r.created_at:.1f}s"
        color = _COLORS.get(r.status, "cyan")
        table.add_row(
            r.name,
            f"[{color}]{r.status}[/]",
            r.secondary_status,
            str(r.spec_data.get("instance_count", 1)),
            created,
            duration,
        )
    out_console().print(table)


def describe(
    job: str = typer.Argument(..., help="the training job's name (shipyard jobs lists them)"),
    as_json: bool = typer.Option(False, "--json", help="the DescribeTrainingJob shape, as JSON"),
) -> None:
    """Describe a job (DescribeTrainingJob shape with --json)."""
    try:
        desc = _control().describe(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    if as_json:
        typer.echo(json.dumps(desc, indent=1, default=_json_default))
        return
    from shipyard.cli.describe_view import configuration

    out = out_console()
    out.print(
        f"[bold]{desc['TrainingJobName']}[/]  {desc['TrainingJobStatus']} / "
        f"{desc['SecondaryStatus']}"
    )
    out.print(configuration(desc))
    if desc.get("FailureReason"):
        out.print("[red]FailureReason:[/]", desc["FailureReason"], markup=True, highlight=False)
    if desc.get("ModelArtifacts"):
        out.print("model:", desc["ModelArtifacts"]["S3ModelArtifacts"])
    if desc["Shipyard"].get("Network", "unshaped") != "unshaped":
        out.print("network:", desc["Shipyard"]["Network"], highlight=False)
    for warning in desc["Shipyard"].get("Warnings", []):
        out.print("[yellow]warning:[/]", warning, markup=True, highlight=False)
    table = Table("host", "attempt", "address", "status", "exit", "log")
    for inst in desc["Shipyard"]["Instances"]:
        table.add_row(
            inst["Host"],
            str(inst["Attempt"]),
            str(inst["Address"]),
            inst["Status"],
            str(inst["ExitCode"]),
            inst["LogPath"] or "",
        )
    out.print(table)
    if desc["FinalMetricDataList"]:
        metrics = Table("metric", "value")
        for m in desc["FinalMetricDataList"]:
            metrics.add_row(m["MetricName"], f"{m['Value']:g}")
        out.print(metrics)
    if desc["Shipyard"].get("StepTiming"):  # measured by shipyard (planner/steps.py)
        from shipyard.planner.steps import describe_line

        out.print("step timing:", describe_line(desc["Shipyard"]["StepTiming"]), highlight=False)
    if desc["Shipyard"].get("DistributionReport"):
        from shipyard.observe.report_view import render

        render(
            desc["Shipyard"]["DistributionReport"],
            out,
            desc["Shipyard"].get("DistributionReportPath"),
        )
    steps = Table("secondary status", "start", "message")
    for t in desc["SecondaryStatusTransitions"]:
        steps.add_row(t["Status"], t["StartTime"].strftime("%H:%M:%S.%f")[:-3], t["StatusMessage"])
    out.print(steps)


def logs(
    job: str = typer.Argument(..., help="the training job's name (shipyard jobs lists them)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
    host: str | None = typer.Option(
        None,
        "--host",
        metavar="algo-K",
        help="one instance (algo-k): its lines and those of its MPI ranks",
    ),
    show_all: bool = typer.Option(
        False, "--all", help="also framework noise (TF C++ INFO, cuInit, NCCL INFO)"
    ),
    timestamps: bool = typer.Option(
        False, "--timestamps", "-t", help="prefix each line with when it was written (UTC)"
    ),
    tail: int | None = typer.Option(
        None, "--tail", "-n", metavar="N", help="only the last N lines (of all hosts together)"
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        metavar="10s|5m|2h|TIME",
        help="only lines written since a duration ago, or an ISO 8601 time",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="one JSON object per line: host, rank, time, line"
    ),
) -> None:
    """Print a job's logs, each line prefixed with its host (and MPI rank), all hosts
    merged in the order the lines were written."""
    from shipyard.control.reading import host_names
    from shipyard.observe import logtimes

    if tail is not None and tail < 0:
        _fail(f"--tail {tail}: give a count of lines, 0 or more", EXIT_BAD_INPUT)
    cutoff = None
    if since is not None:
        try:
            cutoff = logtimes.parse_since(since)
        except ValueError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
    control = _control()
    try:
        record = control.get(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    hosts = host_names(record.spec_data)
    if host and host not in hosts:
        _fail(f"job {job!r} has no host {host!r}; its hosts are {', '.join(hosts)}", EXIT_BAD_INPUT)
    show_noise = True if show_all else logs_noise_default()
    following = follow and not record.terminal
    reader = logtimes.TimedReader(control.log_files(job), live=following)

    def emit(batch: list, last: int | None = None) -> None:
        kept = logtimes.shown(batch, host, show_noise, cutoff, last)
        if kept:
            if as_json:
                text = "".join(logtimes.as_json(ln) + "\n" for ln in kept)
            else:
                text = "".join(logtimes.as_text(ln, timestamps) + "\n" for ln in kept)
            sys.stdout.write(text)
            sys.stdout.flush()

    emit(reader.poll(flush=not following), tail)
    while following:
        time.sleep(0.1)
        record = control.reconcile(control.store.get(job, False))
        for key, path in control.log_files(job).items():
            reader.add(key, path)
        emit(reader.poll(flush=record.terminal))
        following = not record.terminal


def logs_noise_default() -> bool:
    from shipyard.observe.logs import show_noise_default

    return show_noise_default()


def stop(
    job: str = typer.Argument(..., help="the training job's name (shipyard jobs lists them)"),
) -> None:
    """Stop a running job: SIGTERM, a grace period, then SIGKILL."""
    try:
        record = _control().stop(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    console.print(f"{job}: {record.status}")


def register(app: typer.Typer) -> None:
    app.command()(jobs)
    app.command()(describe)
    app.command()(logs)
    app.command()(stop)
