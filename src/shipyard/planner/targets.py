"""What to plan for, from what a user typed: instance types or rates -> :class:`Link`, counts.

``shipyard plan`` and the dashboard's plan section take the same two inputs (a list of
SageMaker types or emulated rates, a list of instance counts) and must turn them into the
same links, TCP framing included, or the page and the terminal would disagree about one
job. ``option`` is how the caller names the input in its errors (``--instance-type`` on
the command line, ``instance_type=`` on the page).
"""

from __future__ import annotations

import math
from typing import Any

from shipyard import instance_types
from shipyard.errors import ValidationError
from shipyard.planner.model import TCP_FRAMING, Link
from shipyard.sandbox import shaping

LOOPBACK_LATENCY_S = 100e-6  # a rate given without a latency: a LAN's round trip


def links(text: str, job_type: str, option: str = "--instance-type") -> list[Link]:
    """A Link per comma-separated item: a SageMaker type (its sustained network) or a rate
    such as ``100mbit`` or ``1gbit/2ms`` (what the ``shipyard:network`` tag takes; the
    tag's ``instance-type`` means ``job_type``'s network)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item.startswith("ml."):
            out.append(Link(item, instance_types.network(item).bytes_per_s, framing=TCP_FRAMING))
        elif item in ("local", "local_gpu"):
            raise ValidationError(
                f"{option} {item!r} has no rated network: give SageMaker types "
                "(ml.p3.16xlarge,ml.p3dn.24xlarge) or rates (100mbit,1gbit)"
            )
        else:
            shape = shaping.parse(item, job_type)
            latency = shape.delay_s * 2 or LOOPBACK_LATENCY_S
            out.append(Link(item, shape.rate_bytes_per_s, latency, TCP_FRAMING))
    return out


def counts(text: str, option: str = "--instances", most: int = 4096) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]: each 1..``most``, sorted, each once."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidationError(
            f"{_named(option, text)}: give instance counts separated by commas, e.g. 2,4,8"
        ) from None
    if not out or min(out) < 1 or max(out) > most:
        raise ValidationError(
            f"{_named(option, text)}: give instance counts, each 1..{most}, e.g. 2,4,8"
        )
    return sorted(set(out))


def _named(option: str, text: str) -> str:
    """``--instances '2,x'`` on the command line, ``instances='2,x'`` in a query."""
    return f"{option}{text[:60]!r}" if option.endswith("=") else f"{option} {text[:60]!r}"


def finite(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: an unsupported row's times are null."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }
