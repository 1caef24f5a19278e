"""Describe's ``Shipyard.StepTiming``: the workers' step-time files, summed up for a person
and the planner.

Each worker that shipyard times (``runtime/steptiming.py``: Keras ``fit``, the shipyard.ps
client) leaves ``step-timing-<pid>.json`` in its instance's agent directory. This module
reads them (from the job's tree: no link followed, size-limited, a bad file skipped) and
keeps warm-up apart: a worker's first steps (graph tracing, the first allocation, the
first connections) are excluded, :func:`warmup_steps` of them, before the medians are
taken over every worker's remaining steps. Compute and communication are given where the
source measured communication (the ps client times its push/pull calls, Horovod its
allreduce, DDP its buckets); overlap (communication hidden behind compute) and bytes per
step where the source sees them (DDP's buckets, Horovod's fused gradients; the shipyard.ps
client's split-phase steps: the time its pushed gradients travelled behind compute).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from shipyard.runtime import safepath
from shipyard.runtime.steptiming import PREFIX, SCHEMA

FILE_LIMIT = 2_000_000  # bytes: MAX_STEPS pairs of numbers fit with room
WARMUP_FRACTION = 0.1
WARMUP_MIN = 2
#: steps after warm-up a plan needs (across the workers) before it trusts the median
MIN_STEPS = 5


def warmup_steps(count: int) -> int:
    """How many of a worker's first steps are warm-up: 10% of them, at least 2, but
    always leaving one step (a worker that ran one step has only that one)."""
    if count <= 1:
        return 0
    return min(count - 1, max(WARMUP_MIN, math.ceil(count * WARMUP_FRACTION)))


def read(job_dir: str, agent_dirs: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every worker's step-timing document, each with its ``host``."""
    docs = []
    for host, agent_dir in sorted(agent_dirs.items()):
        try:
            names = sorted(
                e.name
                for e in os.scandir(agent_dir)
                if e.name.startswith(PREFIX) and e.name.endswith(".json") and e.is_file()
            )
        except OSError:
            continue
        for name in names:
            try:  # from the job's tree: no link followed, a regular file only
                doc = json.loads(
                    safepath.read_text(job_dir, os.path.join(agent_dir, name), FILE_LIMIT)
                )
            except (OSError, ValueError):
                continue
            if _valid(doc):
                docs.append(dict(doc, host=host))
    return docs


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _valid(doc: Any) -> bool:
    """A file of this schema with numbers where numbers go: the job wrote it, and a
    describe must not fail on what a script left in its own tree."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not doc.get("steps"):
        return False
    steps = doc["steps"]
    return (
        isinstance(steps, list)
        and all(
            isinstance(s, list)
            and len(s) in (2, 4)
            and _number(s[0])
            and all(v is None or _number(v) for v in s[1:])
            for s in steps
        )
        and all(
            doc.get(k) is None or _number(doc[k]) for k in ("count", "started", "first_step_at")
        )
        and (doc.get("warmup_steps") is None or _number(doc["warmup_steps"]))
        and isinstance(doc.get("source"), str)
    )


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(math.floor(at))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def summarize(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job's step timing ({} when no worker was timed)."""
    kept: list[tuple[float, float | None]] = []
    extra: list[tuple[float | None, float | None]] = []  # (overlap, bytes) where recorded
    workers = []
    warm = warm_s = 0.0
    run = 0
    for doc in docs:
        steps = [(float(s[0]), None if s[1] is None else float(s[1])) for s in doc["steps"]]
        skip = warmup_steps(len(steps))
        known = doc.get("warmup_steps")  # the source knows its warm-up (a first epoch)
        if isinstance(known, int) and 0 < known < len(steps):
            skip = known
        mine = steps[skip:]
        kept.extend(mine)
        extra.extend((_opt(s[2]), _opt(s[3])) for s in doc["steps"][skip:] if len(s) == 4)
        warm += skip
        warm_s += sum(s for s, _ in steps[:skip])
        run += int(doc.get("count") or len(steps))
        started, first = doc.get("started"), doc.get("first_step_at")
        workers.append(
            {
                "Host": doc.get("host"),
                "Pid": doc.get("pid"),
                "Source": doc.get("source"),
                "Steps": int(doc.get("count") or len(steps)),
                "WarmupSteps": skip,
                "MedianStepSeconds": _r(_quantile([s for s, _ in mine], 0.5)),
                "StartupSeconds": _r(first - started) if started and first else None,
            }
        )
    if not kept:
        return {}
    times = [s for s, _ in kept]
    comms = [c for _, c in kept if c is not None]
    sources = sorted({str(d.get("source")) for d in docs})
    summary: dict[str, Any] = {
        "Source": ", ".join(sources),
        "Workers": len(docs),
        "StepsRun": run,
        "WarmupStepsExcluded": int(warm),
        "WarmupSeconds": _r(warm_s),
        "Steps": len(kept),
        "MedianStepSeconds": _r(_quantile(times, 0.5)),
        "P90StepSeconds": _r(_quantile(times, 0.9)),
        "ComputeSeconds": None,
        "CommSeconds": None,
        "OverlapSeconds": None,
        "BytesPerStep": None,
        "PerWorker": workers,
    }
    if len(comms) == len(kept):
        summary["CommSeconds"] = _r(_quantile(comms, 0.5))
        summary["ComputeSeconds"] = _r(_quantile([s - (c or 0.0) for s, c in kept], 0.5))
    overlaps = [o for o, _ in extra if o is not None]
    sent = [b for _, b in extra if b is not None]
    if overlaps and len(overlaps) == len(kept):
        summary["OverlapSeconds"] = _r(_quantile(overlaps, 0.5))
    if sent and len(sent) == len(kept):
        summary["BytesPerStep"] = int(_quantile(sent, 0.5))
    return summary


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def describe_line(timing: Mapping[str, Any]) -> str:
    """One line for a person: where the steps came from and what they took."""
    line = (
        f"measured by shipyard ({timing['Source']}): {timing['MedianStepSeconds']:.4g}s per "
        f"step (median; p90 {timing['P90StepSeconds']:.4g}s) over {timing['Steps']} steps "
        f"of {timing['Workers']} worker(s); {timing['WarmupStepsExcluded']} warm-up step(s) "
        "excluded"
    )
    if timing.get("CommSeconds") is not None:
        line += (
            f"; compute {timing['ComputeSeconds']:.4g}s + communication "
            f"{timing['CommSeconds']:.4g}s"
        )
    if timing.get("OverlapSeconds") is not None:
        line += f" ({timing['OverlapSeconds']:.4g}s more hidden behind compute)"
    if timing.get("BytesPerStep") is not None:
        line += f"; {timing['BytesPerStep']:,} bytes exchanged per step"
    return line
