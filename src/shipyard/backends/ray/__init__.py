"""The Ray backend: each instance an actor on a node of a real Ray cluster.

``backend`` (the Backend protocol over Ray), ``actor`` (the instance actor that runs the
agent), ``placement`` (which node gets which instance), ``node`` (per-node helpers),
``keeper`` (the detached actor that outlives the submitting process) and ``connect``
(reaching the cluster). ``ray`` itself is imported only when a job uses this backend.
"""

from shipyard.backends.ray.backend import RayBackend

__all__ = ["RayBackend"]
