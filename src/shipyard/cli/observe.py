"""``shipyard metrics``, ``stacks``, ``tensorboard`` and ``ui``: seeing a job
(added to the CLI by register). Exit codes as in cli.app: 2 bad input, 3 no such job."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.markup import escape

from shipyard.errors import JobNotFoundError

console = Console(stderr=True, highlight=False)
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOT_FOUND = 1, 2, 3

# beside `shipyard server` (8765), which the README starts first: both run with their defaults
DASHBOARD_PORT = 8766


def _out() -> Console:
    from shipyard.cli.output import out_console

    return out_console()


def _fail(message: str, code: int) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    raise typer.Exit(code)


def _control():
    """The store's reader, records as stored: these commands show jobs, they never run one,
    so they start without pydantic (a spec is validated where one is used: tensorboard)."""
    from shipyard.control.reading import JobReader

    reader = JobReader()
    reader.validate = False
    return reader


def metrics(
    job: str = typer.Argument(..., help="the training job's name (shipyard jobs lists them)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep showing until the job ends"),
    as_json: bool = typer.Option(False, "--json", help="every point as JSON"),
    usage: bool = typer.Option(
        False, "--utilization", "-u", help="only each instance's CPU, memory, disk, GPU"
    ),
) -> None:
    """A job's metric history (every metric_definitions match, with time and host) and
    each instance's utilization (CPU, memory, disk, network, GPU), sampled as it ran."""
    from shipyard.observe import utilization
    from shipyard.observe.metrics import history
    from shipyard.observe.metrics_view import history_table, point_line

    control = _control()
    try:
        record = control.get(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)

    def used() -> list[dict]:
        return utilization.read(record.job_dir)

    def matched() -> list:
        return [] if usage else control.store.metrics(job)

    defined = record.spec_data.get("metric_definitions")
    if usage or (not defined and (used() or not record.terminal)):
        usage = True
    elif not defined:
        _fail(
            f"job {job!r} has no metric_definitions, so no metrics were recorded, and no "
            "utilization was sampled; pass metric_definitions=[{'Name': ..., 'Regex': ...}] "
            "(or --metric Name=Regex)",
            EXIT_BAD_INPUT,
        )
    if as_json:
        if usage:
            typer.echo(json.dumps(used(), indent=1))
        else:
            typer.echo(json.dumps(history(control.store.metrics(job)), indent=1))
        return
    out = _out()

    def table():
        points = matched() + utilization.points(used())
        return history_table(points, width=max(10, min(60, out.width - 60))) if points else None

    if not follow or record.terminal:
        shown = table()
        if shown is None:
            out.print(f"{job}: no metric matched yet ({record.status})")
            return
        out.print(shown)
        return
    if not out.is_terminal:  # plain lines, one per point, as they come
        seen = 0
        seen_usage = 0
        while True:
            record = control.get(job)
            points = matched()
            for p in points[seen:]:
                typer.echo(point_line(p))
            seen = len(points)
            samples = utilization.points(used()) if usage else []
            for p in samples[seen_usage:]:
                typer.echo(point_line(p))
            seen_usage = len(samples)
            if record.terminal:
                return
            time.sleep(0.5)
    from rich.live import Live

    with Live(console=out, auto_refresh=False) as live:
        while True:
            record = control.get(job)
            shown = table()
            if shown is not None:
                live.update(shown)
                live.refresh()
            if record.terminal:
                return
            time.sleep(0.5)


def tensorboard(
    jobs: list[str] = typer.Argument(..., help="one or more training jobs, each a run"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(6006, "--port", help="TensorBoard's port"),
) -> None:
    """Start TensorBoard over the jobs' TensorBoard output (Ctrl-C ends it)."""
    import importlib.util

    from shipyard.observe import tensorboard as tb

    if importlib.util.find_spec("tensorboard") is None:
        _fail(
            "TensorBoard is not installed: pip install 'shipyard[tensorflow]' (or tensorboard)",
            EXIT_BAD_INPUT,
        )
    control = _control()
    found = []
    for job in dict.fromkeys(jobs):
        try:
            record = control.get(job)
        except JobNotFoundError as exc:
            _fail(str(exc), EXIT_NOT_FOUND)
        try:
            found.append(tb.job_logdir(job, record.job_dir, record.spec))
        except tb.NoTensorBoardOutputError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
    if not tb.port_free(host, port):
        _fail(f"port {port} on {host} is in use: pass another --port", EXIT_BAD_INPUT)
    proc = tb.start(found, host, port)
    console.print(
        f"TensorBoard on http://{host}:{port}/ over "
        + ", ".join(f"{j.job} ({j.logdir})" for j in found)
        + "; Ctrl-C to stop"
    )
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - it must not outlive us
                proc.kill()
                proc.wait()
    if code not in (0, -2, -15):
        raise typer.Exit(EXIT_FAILED)


def stacks(
    job: str = typer.Argument(..., help="the training job's name (shipyard jobs lists them)"),
) -> None:
    """Print the Python stack of every process of every instance of a running job."""
    import psutil

    from shipyard.observe.stacks import StacksUnavailableError, collect, format_stacks

    control = _control()
    try:
        record = control.get(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    if record.terminal:
        _fail(
            f"job {job!r} has ended ({record.status}): stacks exist only while it runs; "
            f"`shipyard logs {job}` shows what it printed",
            EXIT_BAD_INPUT,
        )
    if record.backend != "local":
        _fail(
            f"job {job!r} runs on the {record.backend} backend; `shipyard stacks` reads the "
            "processes of this machine (local backend) only",
            EXIT_BAD_INPUT,
        )
    agents = {
        i.host: i.pid
        for i in control.store.instances(job, record.attempt)
        if i.pid and i.status == "Running" and psutil.pid_exists(i.pid)
    }
    if not agents:
        _fail(f"job {job!r} has no running instance yet ({record.secondary_status})", 1)
    try:
        found = collect(agents)
    except StacksUnavailableError as exc:
        _fail(str(exc), EXIT_FAILED)
    typer.echo("\n".join(format_stacks(found)))


def ui(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(
        DASHBOARD_PORT, "--port", help="the dashboard's port (shipyard server's is 8765)"
    ),
) -> None:
    """The web dashboard: jobs, live logs, metric plots, placement and traffic, endpoints."""
    from shipyard.observe.tensorboard import port_free

    if not port_free(host, port):
        _fail(f"port {port} on {host} is in use: pass another --port", EXIT_BAD_INPUT)
    from shipyard.dashboard.server import serve

    console.print(f"shipyard ui on http://{host}:{port}/ (Ctrl-C to stop)")
    serve(host, port)


def register(app: typer.Typer) -> None:
    app.command()(ui)
    app.command()(stacks)
    app.command()(metrics)
    app.command()(tensorboard)
