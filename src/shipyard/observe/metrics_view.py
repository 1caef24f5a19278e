"""The terminal view of a job's metric history: one row per (metric, host) with its
count, first/last/min/max and a small plot of every value in time order."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.table import Table

from shipyard.observe.metrics import series, sparkline


def history_table(points: list[dict[str, Any]], width: int = 40) -> Table:
    table = Table("metric", "host", "n", "first", "last", "min", "max", "plot (oldest -> newest)")
    for (name, host), group in series(points).items():
        values = [p["value"] for p in group]
        table.add_row(
            name,
            host,
            str(len(values)),
            f"{values[0]:g}",
            f"{values[-1]:g}",
            f"{min(values):g}",
            f"{max(values):g}",
            sparkline(values, width),
        )
    return table


def point_line(point: dict[str, Any]) -> str:
    """One point as a plain line (``--follow`` when the output is not a terminal)."""
    at = dt.datetime.fromtimestamp(point["at"]).strftime("%H:%M:%S.%f")[:-3]
    return f"{at} [{point['host']}] {point['name']}={point['value']:g}"
