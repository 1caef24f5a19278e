"""``shipyard plan JOB``: predict a finished job's speed on other instance types and counts.

The numbers come from :mod:`shipyard.planner` (a pure model of compute plus link time);
this module only reads the job, parses the options and prints a table, a small plot or
JSON. Bad input exits 2 with what is missing and how to get it.
"""

from __future__ import annotations

import json
import math

import typer
from rich.table import Table

from shipyard.errors import JobNotFoundError, ValidationError

DEFAULT_COUNTS = "1,2,4,8,16,32,64"


def plan(
    job: str = typer.Argument(..., help="a finished training job whose measurements to use"),
    instance_type: str | None = typer.Option(
        None, "--instance-type", help="types or rates to plan for, comma-separated"
    ),
    instances: str = typer.Option(DEFAULT_COUNTS, "--instances", help="counts, e.g. 2,4,8"),
    distribution: str | None = typer.Option(
        None, "--distribution", help="plan as these distributions instead (comma-separated)"
    ),
    compute_time: float | None = typer.Option(
        None, "--compute-time", help="seconds of compute per step on the target type"
    ),
    step_time: float | None = typer.Option(
        None, "--step-time", help="the measured job's seconds per step (if it logged none)"
    ),
    steps: int | None = typer.Option(None, "--steps", help="steps per worker the job ran"),
    gradient_bytes: float | None = typer.Option(
        None, "--gradient-bytes", help="gradient bytes per step (jobs without a ps report)"
    ),
    allreduce: str | None = typer.Option(
        None, "--allreduce", help="ring (NCCL, gloo; default) or reduce_bcast (Open MPI's default)"
    ),
    shared_host: float | None = typer.Option(
        None,
        "--shared-host",
        help="predict runs on one machine of this many cores (emulated instances share them)",
    ),
    same_machine: bool = typer.Option(
        False,
        "--same-machine",
        help="predict emulated runs on this machine with its measured ceiling (`shipyard "
        "doctor`): links capped, cores shared, shipyard.ps' CPU charged, as `make demo` does",
    ),
    as_json: bool = typer.Option(False, "--json", help="the predictions as JSON"),
) -> None:
    """Predict steps/s, scaling efficiency and the bottleneck at other types and counts."""
    from shipyard.cli.output import EXIT_BAD_INPUT, EXIT_NOT_FOUND, out_console
    from shipyard.cli.output import fail as _fail
    from shipyard.control.client import ControlPlane
    from shipyard.planner import model, render, targets
    from shipyard.planner.profile import Inputs, from_describe

    try:
        desc = ControlPlane().describe(job)
    except JobNotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    try:
        if shared_host is not None and shared_host <= 0:
            raise ValidationError(
                f"--shared-host {shared_host:g}: give this machine's core count, e.g. "
                "--shared-host $(nproc)"
            )
        if same_machine and shared_host is not None:
            raise ValidationError(
                "--same-machine and --shared-host: give one (--same-machine reads this "
                "machine's cores from its measured ceiling)"
            )
        machine = _machine() if same_machine else None
        counts = targets.counts(instances)
        kinds: list[str | None] = [d.strip() for d in (distribution or "").split(",") if d.strip()]
        rows = []
        measured = None
        for kind in kinds or [None]:
            given = Inputs(
                compute_time,
                step_time,
                steps,
                gradient_bytes,
                kind,
                allreduce,
                shared_host,
                machine,
            )
            measured = from_describe(desc, given)
            wanted = targets.links(instance_type or measured.instance_type, measured.instance_type)
            if machine is None:
                rows.extend(model.plan(measured.profile, wanted, counts))
            else:
                rows.extend(
                    model.same_machine(measured.profile, link, n, machine)
                    for link in wanted
                    for n in counts
                )
    except (ValidationError, ValueError) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    assert measured is not None
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "job": job,
                    "measured": {
                        "instances": measured.instances,
                        "instance_type": measured.instance_type,
                        "step_s": measured.step_s,
                        "compute_s": measured.profile.compute_s,
                        "gradient_bytes": measured.profile.gradient_bytes,
                        "sources": measured.sources,
                    },
                    "rows": [targets.finite(r.to_json()) for r in rows],
                },
                indent=1,
            )
        )
        return
    out = out_console()
    out.print(
        f"[bold]{job}[/]: measured on {measured.instances} x {measured.instance_type}, "
        f"{measured.step_s:.4g}s per step"
    )
    for what, source in measured.sources.items():
        out.print(f"  {what}: {source}", highlight=False)
    table = Table("type", "n", "distribution", "steps/s", "step", "eff.", "bottleneck", "advice")
    for r in rows:
        table.add_row(
            r.instance_type,
            str(r.instances),
            r.distribution,
            f"{r.steps_per_s:.2f}",
            f"{r.step_s * 1e3:.1f} ms" if math.isfinite(r.step_s) else "-",
            f"{r.efficiency:.0%}",
            r.bottleneck,
            r.advice,
        )
    out.print(table)
    out.print(render.plot(rows), highlight=False, markup=False)


def _machine():  # noqa: ANN202 - planner.model.Machine, imported late like the rest
    """This machine's cached ceiling (measured first where none is): the one `make demo`
    and `shipyard doctor` use."""
    from shipyard.control.home import default_home
    from shipyard.planner import ceiling

    return ceiling.get(default_home()).machine()


def register(app: typer.Typer) -> None:
    app.command()(plan)
