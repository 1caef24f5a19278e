"""The plan section of a job's page: ``shipyard plan``'s prediction, served as JSON.

Why here and not by calling the CLI: the dashboard sits beside ``cli/`` on the top floor
and imports neither it nor ``server/``; both turn options into calls of
:mod:`shipyard.planner` (``profile.from_describe`` reads the finished job,
``model.plan`` predicts each row), and this module only turns a page's query into those
calls and the rows into JSON. What the planner refuses (a job still running, one that
measured no step time or no variable sizes) comes back as its own message, which names
what is missing and how to get it; the page shows it where the table would be.

Planning is arithmetic over what the job already measured: a GET computes it and
changes nothing. The answer holds no ``Environment`` value (only the planner's numbers
and where each came from).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shipyard import instance_types
from shipyard.errors import ValidationError
from shipyard.planner import model, targets
from shipyard.planner.profile import Inputs, Measured, from_describe

# compared when the job's own type has no rated network (``local``): the issue's
# question, a small and a big type of one family
FALLBACK_TYPES = "ml.p3.2xlarge,ml.p3.16xlarge"
DEFAULT_COUNTS = "1,2,4,8,16,32,64"
MAX_TYPES = 8  # a GET computes every row: bounded so one request stays cheap
MAX_COUNTS = 32
MAX_COUNT = 4096
NUMBERS = ("compute_time", "step_time", "gradient_bytes")  # optional, seconds or bytes


@dataclass(frozen=True)
class Query:
    """What the page asks for: the CLI's options under the same names."""

    instance_type: str | None = None  # comma-separated types or rates; None: the default
    instances: str = DEFAULT_COUNTS
    distribution: str | None = None  # comma-separated model names; None: the job's own
    compute_time: float | None = None
    step_time: float | None = None
    steps: int | None = None
    gradient_bytes: float | None = None
    allreduce: str | None = None


def query(params: Mapping[str, str]) -> Query:
    """A :class:`Query` from a request's query string; ValidationError names the bad one."""
    known = {
        "instance_type",
        "instances",
        "distribution",
        "steps",
        "allreduce",
        *NUMBERS,
    }
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValidationError(f"unknown plan option(s) {unknown}: use {sorted(known)}")
    values: dict[str, Any] = {}
    for name in NUMBERS:
        if params.get(name):
            values[name] = _positive(name, params[name], float)
    if params.get("steps"):
        values["steps"] = _positive("steps", params["steps"], int)
    allreduce = params.get("allreduce") or None
    if allreduce not in (None, "ring", "reduce_bcast"):
        raise ValidationError(f"allreduce={allreduce!r}: use ring or reduce_bcast")
    return Query(
        instance_type=params.get("instance_type") or None,
        instances=params.get("instances") or DEFAULT_COUNTS,
        distribution=params.get("distribution") or None,
        allreduce=allreduce,
        **values,
    )


def _positive(name: str, text: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        what = "a whole number" if kind is int else "a number"
        raise ValidationError(f"{name}={text[:40]!r}: give {what} above 0, or leave it empty")
    return value


def counts(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4], each 1..MAX_COUNT, at most MAX_COUNTS of them."""
    if len([x for x in text.split(",") if x.strip()]) not in range(1, MAX_COUNTS + 1):
        raise ValidationError(
            f"instances={text[:60]!r}: give 1 to {MAX_COUNTS} counts, each 1..{MAX_COUNT}, "
            "e.g. 2,4,8"
        )
    return targets.counts(text, "instances=", MAX_COUNT)


def default_types(job_type: str) -> str:
    """The job's own type when it has a rated network, else :data:`FALLBACK_TYPES`."""
    try:
        instance_types.network(job_type)
    except ValidationError:
        return FALLBACK_TYPES
    return job_type


def links(text: str, job_type: str) -> list[model.Link]:
    """A Link per item (what ``shipyard plan --instance-type`` takes), at most MAX_TYPES."""
    if len([x for x in text.split(",") if x.strip()]) not in range(1, MAX_TYPES + 1):
        raise ValidationError(
            f"instance_type={text[:60]!r}: give 1 to {MAX_TYPES} SageMaker types or rates "
            "separated by commas, e.g. ml.p3.2xlarge,ml.p3.16xlarge,100mbit"
        )
    return targets.links(text, job_type, "instance_type")


def predict(desc: Mapping[str, Any], q: Query) -> dict[str, Any]:
    """``shipyard plan --json``'s answer for a described job, plus the options used.

    Raises ``planner.profile.PlanInputError`` when the job cannot be planned (the
    planner's message) and ValidationError on a bad option."""
    job_type = str((desc.get("ResourceConfig") or {}).get("InstanceType") or "local")
    # each named once (a repeated one would only repeat the work of a GET)
    kinds: list[str | None] = list(
        dict.fromkeys(d.strip() for d in (q.distribution or "").split(",") if d.strip())
    )
    for kind in kinds:
        if kind not in model.DISTRIBUTIONS:
            raise ValidationError(
                f"distribution {kind!r} is not known: use one of " + ", ".join(model.DISTRIBUTIONS)
            )
    wanted = counts(q.instances)
    type_text = q.instance_type or default_types(job_type)
    wanted_links = links(type_text, job_type)
    rows: list[model.Row] = []
    measured: Measured | None = None
    for kind in kinds or [None]:
        given = Inputs(q.compute_time, q.step_time, q.steps, q.gradient_bytes, kind, q.allreduce)
        measured = from_describe(desc, given)
        rows.extend(model.plan(measured.profile, wanted_links, wanted))
    assert measured is not None
    return {
        "plannable": True,
        "job": desc.get("TrainingJobName"),
        "measured": {
            "instances": measured.instances,
            "instance_type": measured.instance_type,
            "distribution": measured.profile.distribution,
            "step_s": measured.step_s,
            "compute_s": measured.profile.compute_s,
            "gradient_bytes": measured.profile.gradient_bytes,
            "sources": measured.sources,
        },
        "instance_type": ",".join(link.name for link in wanted_links),
        "instances": wanted,
        "distributions": sorted({r.distribution for r in rows}),
        "known_distributions": list(model.DISTRIBUTIONS),  # what distribution= takes
        "rows": [targets.finite(r.to_json()) for r in rows],
    }
