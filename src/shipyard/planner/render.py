"""The plan as text: a small bar plot of predicted steps/s per instance count (no rich
markup, so it reads the same in a terminal, a CI log and a test)."""

from __future__ import annotations

from collections.abc import Sequence

from shipyard.planner import model
from shipyard.planner.model import Row

BAR = "#"


def plot(rows: Sequence[Row], width: int = 40) -> str:
    """One block per (instance type, distribution): a bar per instance count, scaled to
    the fastest row of the whole plan, with the rate and the efficiency."""
    usable = [r for r in rows if r.steps_per_s > 0]
    top = max((r.steps_per_s for r in usable), default=0.0)
    if top <= 0:
        return "(nothing to plot)"
    lines: list[str] = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.instance_type, r.distribution), []).append(r)
    for (itype, dist), group in groups.items():
        lines.append(f"{itype} / {dist}: steps per second")
        for r in group:
            n = round(width * r.steps_per_s / top)
            bar = BAR * max(n, 1 if r.steps_per_s > 0 else 0)
            lines.append(
                f"  {r.instances:>4} | {bar:<{width}} {r.steps_per_s:10.2f}  {r.efficiency:4.0%}"
            )
    return "\n".join(lines)


def same_machine_cell(
    profile: model.Profile, link: model.Link, n: int, machine: model.Machine
) -> str:
    """The planner's steps/s for ``n`` instances emulating ``link`` on this machine, or
    why there is none (a table beside measured runs must not show a number that ignores
    the machine it stands next to)."""
    try:
        row = model.same_machine(profile, link, n, machine)
    except model.Unpredictable as exc:
        return f"(no prediction: {exc})"
    capped = " (capped: host network)" if row.bottleneck == "host network" else ""
    return f"{row.steps_per_s:.2f}{capped}"
