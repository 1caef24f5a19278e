"""``shipyard server`` (SageMaker's API on this machine) and ``shipyard server env``."""

from __future__ import annotations

import errno
import logging
import signal
import sys

import typer

from shipyard import settings
from shipyard.server.env import DEFAULT_PORT

server_app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    help="Serve SageMaker's API here, so the sagemaker SDK and boto3 run unmodified; "
    '`eval "$(shipyard server env)"` points a shell at it.',
)


@server_app.callback()
def server(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind"),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="port (0 picks a free one)"),
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from shipyard.control.home import default_home
    from shipyard.server.app import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)  # close the socket as Ctrl-C does
    try:
        serve(host, port, default_home(), backend=settings.text("SHIPYARD_BACKEND"))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(
                f"error: port {port} on {host} is in use (another shipyard server, or a "
                "program of its own): pass another --port, and the same --port to "
                "`shipyard server env`",
                file=sys.stderr,
            )
        else:
            print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@server_app.command("env")
def env(
    host: str = typer.Option("127.0.0.1", "--host", help="the server's address"),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="the server's port"),
) -> None:
    """Print `export NAME=value` lines for a shell that talks to the server (and runs the
    SageMaker SDK's local mode on shipyard: `docker` stand-ins first on PATH)."""
    from shipyard.control.home import default_home
    from shipyard.server.env import render, variables, write_stand_ins

    home = default_home()
    sys.stdout.write(render(variables(home, host, port), path_first=write_stand_ins(home)))


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")
