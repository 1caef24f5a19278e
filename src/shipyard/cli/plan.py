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


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidationError(
            f"--instances {text!r}: give instance counts separated by commas, e.g. 2,4,8"
        ) from None
    if not counts or min(counts) < 1 or max(counts) > 4096:
        raise ValidationError(f"--instances {text!r}: counts must be 1..4096, e.g. 2,4,8")
    return counts


def links(text: str | None, job_type: str) -> list:
    """A Link per item of --instance-type: a SageMaker type (its sustained network) or a
    rate such as 100mbit (an emulated network, as the shipyard:network tag takes)."""
    from shipyard import instance_types
    from shipyard.planner.model import TCP_FRAMING, Link
    from shipyard.sandbox import shaping

    items = [x.strip() for x in (text or job_type).split(",") if x.strip()]
    out = []
    for item in items:
        if item.startswith("ml."):
            out.append(Link(item, instance_types.network(item).bytes_per_s, framing=TCP_FRAMING))
        elif item in ("local", "local_gpu"):
            raise ValidationError(
                f"--instance-type {item!r} has no rated network: give SageMaker types "
                "(ml.p3.16xlarge,ml.p3dn.24xlarge) or rates (100mbit,1gbit)"
            )
        else:
            shape = shaping.parse(item, job_type)
            latency = shape.delay_s * 2 or 100e-6
            out.append(Link(item, shape.rate_bytes_per_s, latency, TCP_FRAMING))
    return out


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
    as_json: bool = typer.Option(False, "--json", help="the predictions as JSON"),
) -> None:
    """Predict steps/s, scaling efficiency and the bottleneck at other types and counts."""
    from shipyard.cli.output import EXIT_BAD_INPUT, EXIT_NOT_FOUND, out_console
    from shipyard.cli.output import fail as _fail
    from shipyard.control.client import ControlPlane
    from shipyard.planner import model, render
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
        counts = _counts(instances)
        kinds: list[str | None] = [d.strip() for d in (distribution or "").split(",") if d.strip()]
        rows = []
        measured = None
        for kind in kinds or [None]:
            given = Inputs(
                compute_time, step_time, steps, gradient_bytes, kind, allreduce, shared_host
            )
            measured = from_describe(desc, given)
            targets = links(instance_type, measured.instance_type)
            rows.extend(model.plan(measured.profile, targets, counts))
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
                    "rows": [_finite(r.to_json()) for r in rows],
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


def _finite(row: dict) -> dict:
    """JSON has no infinity: an unsupported row's times are null."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }


def register(app: typer.Typer) -> None:
    app.command()(plan)
