"""What ``shipyard describe`` (human form) leads with: the job's configuration, as the
SageMaker console's job page does (instance type and count, framework, hyperparameters,
channels, tags, times), before its instances, metrics and transitions. Pure functions of
the DescribeTrainingJob answer, so the unit tests read them without a job."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from rich.markup import escape
from rich.table import Table


def duration(seconds: float) -> str:
    """``4.2s``, ``3m 04s``, ``2h 05m``: a job's run time as a person reads it."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def local_time(value: dt.datetime | None) -> str:
    """This machine's local time to the second (what ``jobs`` shows), or ``-``."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def hyperparameters(stored: dict[str, str]) -> list[str]:
    """``name=value`` for each of the user's hyperparameters (the ``sagemaker_*`` ones
    are the framework's), each value as the script receives it (stored JSON-encoded)."""
    shown = []
    for key in sorted(stored):
        if key.startswith("sagemaker_"):
            continue
        raw = stored[key]
        try:
            value = json.loads(raw)
        except (TypeError, ValueError):
            value = raw
        shown.append(f"{key}={value if isinstance(value, str) else json.dumps(value)}")
    return shown


def framework(desc: dict[str, Any]) -> str:
    extra = desc.get("Shipyard", {})
    name = extra.get("Framework")
    if not name:
        return "none (generic script)"
    parts = [name, extra.get("FrameworkVersion") or "", extra.get("PyVersion") or ""]
    return " ".join(p for p in parts if p)


def configuration(desc: dict[str, Any], now: float | None = None) -> Table:
    """The configuration block: one ``key  value`` row each, a row per channel."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    res = desc.get("ResourceConfig", {})
    grid.add_row("instances", f"{res.get('InstanceCount', 1)} x {res.get('InstanceType', '')}")
    grid.add_row("framework", escape(framework(desc)))
    program = desc.get("HyperParameters", {}).get("sagemaker_program")
    if program:
        try:
            program = json.loads(program)
        except ValueError:
            pass
        grid.add_row("entry point", escape(str(program)))
    dist = desc.get("Shipyard", {}).get("Distribution") or {}
    if dist.get("kind"):
        options = json.dumps(dist.get("options") or {}, sort_keys=True)
        grid.add_row("distribution", escape(f"{dist['kind']} {options}"))
    grid.add_row(
        "hyperparameters",
        escape(", ".join(hyperparameters(desc.get("HyperParameters", {}))) or "-"),
    )
    channels = desc.get("InputDataConfig") or []
    for i, ch in enumerate(channels):
        source = ch.get("DataSource", {}).get("S3DataSource", {}).get("S3Uri", "")
        grid.add_row(
            "channels" if i == 0 else "",
            escape(f"{ch['ChannelName']}  {source}  ({ch.get('InputMode', 'File')})"),
        )
    if not channels:
        grid.add_row("channels", "-")
    tags = ", ".join(f"{t.get('Key')}={t.get('Value')}" for t in desc.get("Tags") or [])
    grid.add_row("tags", escape(tags or "-"))
    created, started, ended = (
        desc.get("CreationTime"),
        desc.get("TrainingStartTime"),
        desc.get("TrainingEndTime"),
    )
    grid.add_row("created", local_time(created))
    grid.add_row("started", local_time(started))
    grid.add_row("ended", local_time(ended) if ended else "- (running)")
    if started:
        end = ended.timestamp() if ended else (now or dt.datetime.now().timestamp())
        grid.add_row("duration", duration(end - started.timestamp()))
    else:
        grid.add_row("duration", "-")
    return grid
