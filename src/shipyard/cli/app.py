"""The ``shipyard`` command line: train, jobs, describe, logs, stop.

Exit codes: 0 success; 1 the job failed (or was stopped); 2 bad input, refused before
anything started; 3 no such job; 130 interrupted by Ctrl-C, 143 by SIGTERM (either way the
job was stopped: status Stopped, every instance gone).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from shipyard.cli.helptext import FlagsGroup
from shipyard.cli.output import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    fail,
    out_console,
)
from shipyard.control.lifecycle import JobStatus
from shipyard.errors import JobFailedError, JobNotFoundError, ShipyardError, ValidationError

app = typer.Typer(
    cls=FlagsGroup,  # flags shown as flags in --help (see helptext)
    add_completion=False,
    no_args_is_help=True,
    help="SageMaker-style distributed training on your own machines.",
)
console = Console(stderr=True, highlight=False)


@app.callback()
def _options(
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="no progress lines or bars (staging, installs, uploads)"
    ),
) -> None:
    """SageMaker-style distributed training on your own machines."""
    if quiet:
        from shipyard.observe import progress

        progress.set_quiet(True)


def _control():
    from shipyard.control.client import ControlPlane

    return ControlPlane()


def _pairs(items: list[str], what: str, parse_json: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValidationError(f"{what} {item!r} must look like name=value")
        if parse_json:
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = value
        else:
            out[key] = value
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def _fail(message: str, code: int) -> None:
    fail(message, code)


@app.command()
def train(
    entry_point: str = typer.Argument(..., help="training script (relative to --source-dir)"),
    source_dir: str | None = typer.Option(
        None, "--source-dir", help="directory shipped with the script"
    ),
    instance_count: int = typer.Option(1, "--instance-count", "-n", help="instances (algo-1..N)"),
    instance_type: str = typer.Option(
        "local", "--instance-type", help="an ml.* instance type, or local / local_gpu"
    ),
    hyperparameter: list[str] = typer.Option(
        [], "--hyperparameter", "-H", help="k=v; v is parsed as JSON when it can be (2 -> int)"
    ),
    channel: list[str] = typer.Option(
        [], "--channel", "-c", help="name=uri (local path or file://)"
    ),
    distribution: str | None = typer.Option(
        None, "--distribution", help='JSON, e.g. \'{"mpi": {"enabled": true}}\''
    ),
    framework: str | None = typer.Option(None, "--framework", help="tensorflow | pytorch"),
    dependency: list[str] = typer.Option(
        [], "--dependency", help="a directory shipped beside the code and put on PYTHONPATH"
    ),
    env: list[str] = typer.Option([], "--env", "-e", help="K=V for the training processes"),
    metric: list[str] = typer.Option([], "--metric", help="Name=Regex (first group is the value)"),
    job_name: str | None = typer.Option(None, "--job-name", help="the job's exact name"),
    base_job_name: str | None = typer.Option(
        None, "--base-job-name", help="name prefix; a timestamp is appended"
    ),
    output_path: str | None = typer.Option(
        None,
        "--output-path",
        help="where model.tar.gz and output.tar.gz go (dir, file:// or s3://)",
    ),
    max_run: int = typer.Option(
        24 * 3600, "--max-run", help="seconds before the job is stopped (MaxRuntimeExceeded)"
    ),
    max_retry_attempts: int = typer.Option(
        0, "--max-retry-attempts", help="restarts of every instance after a failed attempt"
    ),
    tag: list[str] = typer.Option([], "--tag", help="Key=Value training job tag"),
    network: str | None = typer.Option(
        None,
        "--network",
        help="emulate a network: instance-type, or a rate such as 50mbit or 50mbit/2ms",
    ),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="return at once; the job keeps running"
    ),
    backend: str | None = typer.Option(
        None, "--backend", help="local (default, or $SHIPYARD_BACKEND) | ray"
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="host:port, ray://host:port or auto (default $SHIPYARD_RAY_ADDRESS)",
    ),
) -> None:
    """Run a training script on N instances (SageMaker script mode)."""
    from shipyard.sdk.estimator import Estimator
    from shipyard.sdk.pytorch import PyTorch
    from shipyard.sdk.tensorflow import TensorFlow

    classes = {None: Estimator, "tensorflow": TensorFlow, "pytorch": PyTorch}
    try:
        if framework not in classes:
            raise ValidationError(f"--framework must be tensorflow or pytorch, got {framework!r}")
        try:
            dist = json.loads(distribution) if distribution else None
        except ValueError as exc:
            raise ValidationError(f"--distribution is not valid JSON: {exc}") from None
        from shipyard.sdk.session import Session

        session = Session(backend=backend, address=ray_address)
        estimator = classes[framework](
            session=session,
            entry_point=entry_point,
            source_dir=source_dir,
            instance_count=instance_count,
            instance_type=instance_type,
            hyperparameters=_pairs(hyperparameter, "--hyperparameter", True),
            distribution=dist,
            dependencies=dependency,
            environment=_pairs(env, "--env"),
            metric_definitions=[
                {"Name": k, "Regex": v} for k, v in _pairs(metric, "--metric").items()
            ],
            base_job_name=base_job_name,
            output_path=output_path,
            max_run=max_run,
            max_retry_attempts=max_retry_attempts,
            tags=[
                {"Key": k, "Value": v}
                for k, v in {
                    **_pairs(tag, "--tag"),
                    **({"shipyard:network": network} if network else {}),
                }.items()
            ],
        )
        inputs = _pairs(channel, "--channel") or None
        estimator.fit(inputs, wait=not detach, job_name=job_name)
    except JobFailedError as exc:
        _fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt as exc:
        from shipyard.control.interrupt import EXIT_TERMINATED, Terminated

        terminated = isinstance(exc, Terminated)
        console.print(f"{'terminated' if terminated else 'interrupted'}: the job was stopped")
        raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
    except (ValidationError, TypeError) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except ShipyardError as exc:
        _fail(str(exc), EXIT_FAILED)
    name = estimator.latest_training_job.job_name
    if detach:
        typer.echo(name)
        return
    record = estimator.session.control.get(name)
    console.print(
        f"{name}: [bold]{record.status}[/]"
        + (f"  model: {record.model_artifact}" if record.model_artifact else "")
    )
    if record.status is not JobStatus.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


_COLORS = {JobStatus.COMPLETED: "green", JobStatus.FAILED: "red", JobStatus.STOPPED: "yellow"}


@app.command()
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
            str(r.spec.instance_count),
            created,
            duration,
        )
    out_console().print(table)


@app.command()
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


@app.command()
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
    from shipyard.observe.logs import LogTailer, print_lines, select

    control = _control()
    try:
        record = control.get(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    hosts = record.spec.hosts
    if host and host not in hosts:
        _fail(f"job {job!r} has no host {host!r}; its hosts are {', '.join(hosts)}", EXIT_BAD_INPUT)
    show_noise = True if show_all else None
    if follow and not record.terminal:
        control.wait(job, logs=True, stream=sys.stdout, host=host, show_noise=show_noise)
        return
    lines = LogTailer(control.log_files(job)).poll(flush=True)
    print_lines(select(lines, host), sys.stdout, show_noise=show_noise)


@app.command()
def stop(
    job: str = typer.Argument(..., help="the training job's name (shipyard jobs lists them)"),
) -> None:
    """Stop a running job: SIGTERM, a grace period, then SIGKILL."""
    try:
        record = _control().stop(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    console.print(f"{job}: {record.status}")


from shipyard.cli.endpoints import register as _register_endpoints  # noqa: E402

_register_endpoints(app)  # serve, endpoints, endpoints delete (issue #8)

from shipyard.cli.observe import register as _register_observe  # noqa: E402

_register_observe(app)  # metrics, stacks, tensorboard, ui (issue #21)

from shipyard.cli.doctor import register as _register_doctor  # noqa: E402

_register_doctor(app)  # doctor (issue #15)

from shipyard.cli.server import register as _register_server  # noqa: E402

_register_server(app)  # server, server env (issue #18)

from shipyard.cli.plan import register as _register_plan  # noqa: E402

_register_plan(app)  # plan (issue #29)


def main() -> None:
    app()
