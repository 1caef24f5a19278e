"""metric_definitions: SageMaker's ``[{'Name': ..., 'Regex': ...}]`` applied to log lines.

As in SageMaker, the first capture group of a matching regex is the value; every
match is kept with its time and host, and the last value of each metric is the
``FinalMetricDataList`` entry.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class MetricExtractor:
    def __init__(self, definitions: Iterable[dict[str, str]]) -> None:
        self.patterns = [(d["Name"], re.compile(d["Regex"])) for d in definitions]

    def extract(
        self, lines: Iterable[tuple[str, str]], now: float | None = None
    ) -> list[tuple[str, float, float, str]]:
        if not self.patterns:
            return []
        now = time.time() if now is None else now
        points = []
        for host, line in lines:
            for name, pattern in self.patterns:
                for match in pattern.finditer(line):
                    raw = match.group(1) if match.groups() else match.group(0)
                    try:
                        value = float(raw)
                    except (TypeError, ValueError):
                        continue
                    if math.isfinite(value):
                        points.append((name, value, now, host))
        return points


def final_metrics(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Last value of each metric, in first-seen order (FinalMetricDataList)."""
    last: dict[str, Mapping[str, Any]] = {}
    for p in points:
        last[p["name"]] = p
    return [{"MetricName": n, "Value": p["value"], "Timestamp": p["at"]} for n, p in last.items()]


def history(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every recorded match, in order: ``{MetricName, Value, Timestamp, Host}`` (epoch s)."""
    return [
        {"MetricName": p["name"], "Value": p["value"], "Timestamp": p["at"], "Host": p["host"]}
        for p in points
    ]


BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    """A one-line plot of ``values`` (resampled to at most ``width`` columns)."""
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[int(i * step)] for i in range(width - 1)] + [values[-1]]
    lo, hi = min(values), max(values)
    span = hi - lo
    if span == 0:
        return BLOCKS[3] * len(values)
    return "".join(BLOCKS[min(7, int((v - lo) / span * 7 + 0.5))] for v in values)


def series(
    points: Sequence[Mapping[str, Any]],
) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Points grouped by (metric, host), each group in time order."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for p in points:
        out.setdefault((p["name"], p["host"]), []).append(p)
    return out
