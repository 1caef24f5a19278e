"""Plan before you pay: predict a distributed job's speed on other instance types and counts.

Why: "how much faster on a bigger type or on more instances?" and "parameter servers or
Horovod, and how many servers?" are answered on SageMaker by paying for trial jobs.
shipyard already measures what decides them (the compute time of a step, the bytes each
worker sends each server or peer, the variables' placement); this package turns such a
measured :class:`~shipyard.planner.model.Profile` and an instance type's network
(:func:`shipyard.instance_types.network`) into predicted step rates, scaling efficiency,
the bottleneck of each row and what would remove it.

Layers: ``model`` is pure arithmetic (unit-tested against hand-computed cases),
``profile`` reads a finished job's describe output into a Profile, ``render`` draws the
terminal plot (``shipyard plan``'s table is in :mod:`shipyard.cli.plan`). Distinct from
:mod:`shipyard.control.plan`, which plans a job's *launch* (addresses, agent configs).
"""

# the coordinator's rows (TensorFlow's ParameterServerStrategy) register with the model
# on import: imported here, so that every user of the planner has them
from shipyard.planner import coordinator as _coordinator  # noqa: F401
