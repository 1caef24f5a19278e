"""``shipyard describe``'s view of a distribution report (schema shipyard.ps.report/v1).

One renderer for every parameter server (TensorFlow's, shipyard.ps): the ps table
(where the bytes live, what crossed the wire), the imbalance, the variable placement
and the worker x ps traffic matrix. Reads only the schema's documented keys, plus the
optional ``traffic.peers`` names and ``warnings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

MAX_PLACEMENT_ROWS = 40


def human(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def _peer_names(traffic: Mapping[str, Any]) -> list[str]:
    peers = traffic.get("peers")
    return list(peers) if peers else [f"worker {w}" for w in traffic.get("workers", [])]


def render(report: Mapping[str, Any], out: Console, path: str | None = None) -> None:
    policy = report.get("policy")
    title = f"Distribution report: {report.get('implementation', 'shipyard')} parameter servers"
    if report.get("layout"):
        title += f" ({report['layout']} layout)"
    out.print(f"[bold]{title}[/]" + (f"  [dim]{path}[/]" if path else ""))
    shards = Table("ps", "host", "endpoint", "variables", "bytes", "wire in", "wire out")
    for s in report.get("shards", []):
        shards.add_row(
            str(s.get("shard")),
            str(s.get("host", "")),
            str(s.get("endpoint", "")),
            str(s.get("keys")),
            human(s.get("bytes")),
            human(s.get("bytes_in")),
            human(s.get("bytes_out")),
        )
    out.print(shards)
    imbalance = (report.get("imbalance") or {}).get(policy)
    out.print(
        f"placement policy: {policy} ({report.get('requested_policy')}); imbalance "
        f"(max/mean bytes per ps): {imbalance if imbalance is not None else '-'}"
    )
    entries = list(report.get("placement", []))
    placement = Table("variable", "shape", "dtype", "bytes", "ps")
    for e in entries[:MAX_PLACEMENT_ROWS]:
        placement.add_row(
            str(e["key"]),
            str(tuple(e.get("shape") or ())),
            str(e.get("dtype")),
            human(e.get("bytes")),
            ",".join(str(s) for s in e.get("shard", [])),
        )
    if len(entries) > MAX_PLACEMENT_ROWS:
        placement.add_row(f"... {len(entries) - MAX_PLACEMENT_ROWS} more (--json)", "", "", "", "")
    out.print(placement)
    traffic = report.get("traffic") or {}
    names = _peer_names(traffic)
    if names:
        matrix = Table("to ps / from ps", *[f"ps {s}" for s in traffic.get("shards", [])])
        for i, name in enumerate(names):
            cells = [
                f"{human(a)} / {human(b)}"
                for a, b in zip(traffic["bytes_to_shard"][i], traffic["bytes_from_shard"][i])
            ]
            matrix.add_row(name, *cells)
        out.print(matrix)
    for warning in report.get("warnings", []):
        out.print(f"[yellow]WARNING:[/] {warning}", markup=True, highlight=False)
