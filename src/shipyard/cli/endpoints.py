"""``shipyard serve`` and ``shipyard endpoints [delete NAME]`` (added to the CLI by register).

``serve`` creates an endpoint like ``deploy()`` does; in the foreground (default) it
follows the server log until Ctrl-C and then deletes the endpoint; with ``--detach``
it returns once the endpoint is InService and leaves it running.
"""

from __future__ import annotations

import json
import os
import sys
import time

import typer
from rich.console import Console
from rich.table import Table

from shipyard.errors import ValidationError

# control.endpoints (the model data, staging and pydantic with it) is imported in the
# commands' bodies: `serve --help` and `endpoints --help` never start it (issue 40)

console = Console(stderr=True, highlight=False)
endpoints_app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    help="List endpoints; `endpoints delete NAME` stops one.",
)


def _out() -> Console:
    from shipyard.cli.output import out_console

    return out_console()


def _fail(message: str, code: int) -> None:
    console.print(f"[bold red]error:[/] {message}", markup=True)
    raise typer.Exit(code)


def serve(
    model_data: str = typer.Argument(
        ..., help="model.tar.gz, model directory or training job name"
    ),
    port: int | None = typer.Option(8080, "--port", help="0 picks a free port"),
    workers: int = typer.Option(1, "--workers", help="worker processes"),
    name: str | None = typer.Option(None, "--name", help="endpoint name"),
    framework: str = typer.Option(
        "auto", "--framework", help="auto | tensorflow | pytorch | python"
    ),
    entry_point: str | None = typer.Option(None, "--entry-point", help="inference.py"),
    source_dir: str | None = typer.Option(
        None, "--source-dir", help="directory holding the entry point and its modules"
    ),
    batch_size: int = typer.Option(0, "--batch-size", help="dynamic batching: max rows per call"),
    batch_wait_ms: float = typer.Option(2.0, "--batch-wait-ms", help="dynamic batching: max wait"),
    detach: bool = typer.Option(False, "--detach", "-d", help="return once InService"),
    instance_type: str = typer.Option(
        "local", "--instance-type", help="the workers' sandbox: CPUs, memory, GPUs of this type"
    ),
) -> None:
    """Serve a model on /ping, /invocations and the TF Serving REST API."""
    from shipyard.control.endpoints import EndpointError, Endpoints, EndpointStatus
    from shipyard.sdk.naming import name_from_base

    eps = Endpoints()
    name = name or name_from_base("shipyard-endpoint")
    try:
        record = eps.create(
            name,
            model_data,
            framework=framework,
            entry_point=entry_point,
            source_dir=source_dir,
            port=port or None,
            workers=workers,
            batch_size=batch_size,
            batch_wait_ms=batch_wait_ms,
            instance_type=instance_type,
        )
        try:
            record = eps.wait(name)
        except BaseException:
            eps.delete(name)
            raise
    except ValidationError as exc:
        _fail(str(exc), 2)
    except EndpointError as exc:
        _fail(str(exc), 1)
    console.print(f"{name}: [bold]InService[/] at {record.url}")
    if detach:
        typer.echo(name)
        return
    try:
        with open(record.log_path, "rb") as log:
            while True:
                chunk = log.read()
                if chunk:
                    sys.stderr.buffer.write(chunk)
                    sys.stderr.flush()
                if eps.get(name).status is not EndpointStatus.IN_SERVICE:
                    _fail(f"endpoint {name} stopped: {eps.get(name).failure_reason}", 1)
                time.sleep(0.5)
    except KeyboardInterrupt:
        console.print(f"stopping {name}")
    finally:
        if os.path.exists(eps.endpoint_dir(name)):
            eps.delete(name)


@endpoints_app.callback()
def endpoints(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="the list as JSON"),
) -> None:
    """List endpoints, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    from shipyard.control.endpoints import Endpoints, EndpointStatus

    records = Endpoints().list()
    if as_json:
        typer.echo(json.dumps([r.describe() for r in records], indent=1))
        return
    if not records:
        _out().print(
            "no endpoints yet; serve a trained model with `shipyard serve JOB` "
            "(or a model.tar.gz; `shipyard serve --help` shows how)",
            highlight=False,
        )
        return
    table = Table("name", "status", "url", "pid", "model data", "reason")
    for r in records:
        color = {EndpointStatus.IN_SERVICE: "green", EndpointStatus.FAILED: "red"}.get(
            r.status, "cyan"
        )
        table.add_row(
            r.name,
            f"[{color}]{r.status}[/]",
            r.url,
            str(r.pid),
            r.model_data,
            r.failure_reason or "",
        )
    _out().print(table)


@endpoints_app.command("delete")
def delete(name: str = typer.Argument(..., help="the endpoint's name")) -> None:
    """Stop an endpoint's server and workers and forget it."""
    from shipyard.control.endpoints import EndpointNotFoundError, Endpoints

    try:
        Endpoints().delete(name)
    except EndpointNotFoundError as exc:
        _fail(str(exc), 3)
    console.print(f"{name}: deleted")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.add_typer(endpoints_app, name="endpoints")
