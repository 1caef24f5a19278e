"""The ``shipyard`` command line: the top group, and the table of its commands.

Exit codes: 0 success; 1 the job failed (or was stopped); 2 bad input, refused before
anything started; 3 no such job; 130 interrupted by Ctrl-C, 143 by SIGTERM (either way the
job was stopped: status Stopped, every instance gone).

Each command lives in a module of this package with a ``register(app)``; ``COMMANDS`` names
them in the order ``--help`` lists them, with the help line it shows, and a command's
module is imported only when that command runs (cli.lazy: issue 40, every command under
0.3 s of CPU, ``--help`` without pydantic, staging or the model server).
"""

from __future__ import annotations

import typer

from shipyard.cli.lazy import Entry, LazyGroup

COMMANDS: dict[str, Entry] = {
    "train": Entry(
        "shipyard.cli.train", "Run a training script on N instances (SageMaker script mode)."
    ),
    "jobs": Entry("shipyard.cli.jobs", "List training jobs, newest first."),
    "describe": Entry(
        "shipyard.cli.jobs", "Describe a job (DescribeTrainingJob shape with --json)."
    ),
    "logs": Entry(
        "shipyard.cli.jobs",
        "Print a job's logs, each line prefixed with its host (and MPI rank), all hosts\n"
        "merged in the order the lines were written.",
    ),
    "stop": Entry(
        "shipyard.cli.jobs", "Stop a running job: SIGTERM, a grace period, then SIGKILL."
    ),
    # serve, endpoints, endpoints delete (issue #8)
    "serve": Entry(
        "shipyard.cli.endpoints",
        "Serve a model on /ping, /invocations and the TF Serving REST API.",
    ),
    # metrics, stacks, tensorboard, ui (issue #21)
    "ui": Entry(
        "shipyard.cli.observe",
        "The web dashboard: jobs, live logs, metric plots, placement and traffic, endpoints.",
    ),
    "stacks": Entry(
        "shipyard.cli.observe",
        "Print the Python stack of every process of every instance of a running job.",
    ),
    "metrics": Entry(
        "shipyard.cli.observe",
        "A job's metric history (every metric_definitions match, with time and host) and\n"
        "each instance's utilization (CPU, memory, disk, network, GPU), sampled as it ran.",
    ),
    "tensorboard": Entry(
        "shipyard.cli.observe",
        "Start TensorBoard over the jobs' TensorBoard output (Ctrl-C ends it).",
    ),
    # doctor (issue #15)
    "doctor": Entry(
        "shipyard.cli.doctor",
        "What this machine supports (sandboxes, FUSE, MPI, TF, torch, GPUs), each gap's fix.",
    ),
    # plan (issue #29)
    "plan": Entry(
        "shipyard.cli.plan",
        "Predict steps/s, scaling efficiency and the bottleneck at other types and counts.",
    ),
    "endpoints": Entry(
        "shipyard.cli.endpoints", "List endpoints; `endpoints delete NAME` stops one."
    ),
    # server, server env (issue #18)
    "server": Entry(
        "shipyard.cli.server",
        "Serve SageMaker's API here, so the sagemaker SDK and boto3 run unmodified; "
        '`eval "$(shipyard server env)"` points a shell at it.',
    ),
}


class ShipyardGroup(LazyGroup):
    """The top group: flags shown as flags in --help (helptext), commands from COMMANDS."""

    ENTRIES = COMMANDS


app = typer.Typer(
    cls=ShipyardGroup,
    no_args_is_help=True,
    help="SageMaker-style distributed training on your own machines.",
)


def _version(value: bool) -> None:
    if value:
        from shipyard import __version__

        typer.echo(f"shipyard {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="no progress lines or bars (staging, installs, uploads)"
    ),
    version: bool = typer.Option(
        False,
        "--version",
        help="print shipyard's version and exit",
        is_eager=True,
        callback=_version,
    ),
) -> None:
    """SageMaker-style distributed training on your own machines."""
    if quiet:
        from shipyard.observe import progress

        progress.set_quiet(True)


def main() -> None:
    app()
