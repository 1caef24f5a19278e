"""The house in one list: every package and top-level module of shipyard, on its floor.

Top floor first. A package may import only packages on floors *below* its own (never one
beside it, never one above): so nothing can close a cycle between packages, and a
library that runs inside an instance (ps, horovod, tf, ...) can never pull in the
control plane. ``tests/unit/house/test_layers.py`` reads every import statement in
``src/shipyard`` (lazy ones inside functions too) against this list, fails on a package
that is on no floor, and checks that no package has a cycle between its own modules.
``docs/architecture.md`` describes each floor; its table is this list.

Names are relative to ``shipyard``; a dotted name (``observe.ui``) is a sub-package
placed apart from its parent, matched before the parent.
"""

from __future__ import annotations

FLOORS: tuple[tuple[str, ...], ...] = (
    # the doors a person uses: the command line
    ("cli",),
    # the doors programs use: SageMaker's own API, the web dashboard, and the
    # ``shipyard.estimator``-style aliases of the SageMaker SDK's module names
    (
        "server",
        "dashboard",
        "estimator",
        "session",
        "inputs",
        "pytorch",
        "tensorflow",
        "serializers",
        "deserializers",
    ),
    # the user's Python API (Estimator, Model, Predictor, ...)
    ("sdk",),
    # the control plane: job store, lifecycle, staging, supervisor, endpoints
    ("control",),
    # where instances run: local processes or a Ray cluster
    ("backends",),
    # one per instance: lays out /opt/ml, starts the runner's processes
    ("agent",),
    # the job's contract: agent.json, the sandbox plan, the instance tree, what a runner
    # plans; control, backends and the agent all read it (issue 36)
    ("jobplan",),
    # the performance model behind `shipyard plan` (reads job records and the shaping tags)
    ("planner",),
    # libraries: the ones imported by user scripts inside instances (ps, horovod, tf,
    # ddp, mpi, data), the model server, the sandbox, reports and logs, the planner
    (
        "tf",
        "ps",
        "ddp",
        "mpi",
        "data",
        "serving",
        "sandbox",
        "observe",
        "environments",
    ),
    # the Horovod-compatible collectives, under the data-parallel library's API built on them
    ("horovod",),
    # object stores, the debugger-hook shapes the SDK and the server share, and the one
    # HTTP layer (uvicorn adapter, limits, refusals) every shipyard server is served by
    ("storage", "debugger", "http"),
    # the one validated description of a job
    ("spec",),
    # what a spec is made of (its fields and checks without pydantic, issue 40), the
    # settings, and the process helpers every process uses
    ("spec_model", "distribution", "instance_types", "settings", "runtime"),
    # the ground: the error tree, and this map
    ("errors", "floors"),
)

#: entries that other branches add; absent here until they land (issue 26)
PENDING: frozenset[str] = frozenset()


def floor_of(module: str) -> int | None:
    """The floor (0 = top) of a dotted module name under ``shipyard``, by its longest
    listed prefix; None when it is on no floor."""
    best: tuple[int, int] | None = None
    for number, names in enumerate(FLOORS):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (number, len(name))
    return None if best is None else best[0]


def entry_of(module: str) -> str | None:
    """The listed name that places ``module`` (its longest listed prefix)."""
    names = [n for floor in FLOORS for n in floor if module == n or module.startswith(n + ".")]
    return max(names, key=len) if names else None
