"""``shipyard train``: run a training script on N instances (added to the CLI by register).
Exit codes as in cli.app. The SDK (and with it pydantic and staging) is imported when the
command runs, never for another command or ``--help``."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

from shipyard.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, fail
from shipyard.control.lifecycle import JobStatus
from shipyard.errors import JobFailedError, ShipyardError, ValidationError

console = Console(stderr=True, highlight=False)


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


def _fail(message: str, code: int) -> None:
    fail(message, code)


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
        [],
        "--hyperparameter",
        "-H",
        metavar="NAME=VALUE",
        help="k=v; v is parsed as JSON when it can be (2 -> int)",
    ),
    channel: list[str] = typer.Option(
        [], "--channel", "-c", metavar="NAME=URI", help="name=uri (local path or file://)"
    ),
    distribution: str | None = typer.Option(
        None, "--distribution", help='JSON, e.g. \'{"mpi": {"enabled": true}}\''
    ),
    framework: str | None = typer.Option(None, "--framework", help="tensorflow | pytorch"),
    dependency: list[str] = typer.Option(
        [],
        "--dependency",
        metavar="DIR",
        help="a directory shipped beside the code and put on PYTHONPATH",
    ),
    env: list[str] = typer.Option(
        [], "--env", "-e", metavar="KEY=VALUE", help="K=V for the training processes"
    ),
    metric: list[str] = typer.Option(
        [], "--metric", metavar="NAME=REGEX", help="Name=Regex (first group is the value)"
    ),
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
    volume_size: int = typer.Option(
        30, "--volume-size", help="GB of each instance's disk under /opt/ml (VolumeSizeInGB)"
    ),
    max_retry_attempts: int = typer.Option(
        0, "--max-retry-attempts", help="restarts of every instance after a failed attempt"
    ),
    tag: list[str] = typer.Option(
        [], "--tag", metavar="KEY=VALUE", help="Key=Value training job tag"
    ),
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
            volume_size=volume_size,
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


def register(app: typer.Typer) -> None:
    app.command()(train)
