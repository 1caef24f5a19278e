"""The terminal view of a job's metric history: one row per (metric, host) with its
count, first/last/min/max and a small plot of every value in time order."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.table import Table

from shipyard.observe.metrics import series, sparkline

_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def human_bytes(value: float) -> str:
    """``26.3 MB``, not ``2.63e+07``: decimal units (as ``docker stats`` and the
    CloudWatch console show bytes), three significant digits."""
    size = float(value)
    for unit in _BYTE_UNITS:
        if abs(size) < 999.95 or unit == _BYTE_UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def value_text(name: str, value: float) -> str:
    """A metric's value as shown: a byte count (``...Bytes``) human-readably, a
    percentage (``...Utilization``) to one decimal, any other value as ``%g``."""
    if name.endswith("Bytes"):
        return human_bytes(value)
    if name.endswith("Utilization"):
        return f"{value:.1f}%"
    return f"{value:g}"


def history_table(points: list[dict[str, Any]], width: int = 40) -> Table:
    table = Table("metric", "host", "n", "first", "last", "min", "max", "plot (oldest -> newest)")
    for (name, host), group in series(points).items():
        values = [p["value"] for p in group]
        table.add_row(
            name,
            host,
            str(len(values)),
            value_text(name, values[0]),
            value_text(name, values[-1]),
            value_text(name, min(values)),
            value_text(name, max(values)),
            sparkline(values, width),
        )
    return table


def point_line(point: dict[str, Any]) -> str:
    """One point as a plain line (``--follow`` when the output is not a terminal)."""
    at = dt.datetime.fromtimestamp(point["at"]).strftime("%H:%M:%S.%f")[:-3]
    return f"{at} [{point['host']}] {point['name']}={value_text(point['name'], point['value'])}"
