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
    limit: int = typer.Option(50, "--limit", help="at most this many jobs, newest first"),
    as_json: bool = typer.Option(False, "--json", help="the list as JSON"),
) -> None:
    """List training jobs, newest first."""
    records = _control().list(limit)
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
    out = out_console()
    out.print(
        f"[bold]{desc['TrainingJobName']}[/]  {desc['TrainingJobStatus']} / "
        f"{desc['SecondaryStatus']}"
    )
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
        None, "--host", help="one instance (algo-k): its lines and those of its MPI ranks"
    ),
    show_all: bool = typer.Option(
        False, "--all", help="also framework noise (TF C++ INFO, cuInit, NCCL INFO)"
    ),
) -> None:
    """Print a job's logs, each line prefixed with its host (and MPI rank)."""
    from shipyard.control.reading import host_names
    from shipyard.observe.logs import LogTailer, print_lines, select

    control = _control()
    try:
        record = control.get(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    hosts = host_names(record.spec_data)
    if host and host not in hosts:
        _fail(f"job {job!r} has no host {host!r}; its hosts are {', '.join(hosts)}", EXIT_BAD_INPUT)
    show_noise = True if show_all else None
    if follow and not record.terminal:
        control.wait(job, logs=True, stream=sys.stdout, host=host, show_noise=show_noise)
        return
    lines = LogTailer(control.log_files(job)).poll(flush=True)
    print_lines(select(lines, host), sys.stdout, show_noise=show_noise)


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
