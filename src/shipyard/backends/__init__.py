"""Where instances run. ``local`` (processes on this machine) is the embedded default;
``ray`` runs each instance as an actor on a node of a Ray cluster.

A backend name may carry its address: ``ray@<address>`` (``ray@auto``,
``ray@10.0.0.5:6379``, ``ray@ray://head:10001``); the job store records the name, so a
detached supervisor reaches the same cluster.
"""

from __future__ import annotations

from shipyard.backends.api import Backend


def get(name: str) -> Backend:
    kind, _, address = name.partition("@")
    if kind == "local":
        from shipyard.backends.local import LocalBackend

        return LocalBackend()
    if kind == "ray":
        from shipyard.backends.ray import RayBackend

        return RayBackend(address or None)
    raise ValueError(f"unknown backend {name!r}; available: 'local', 'ray'")


def validate(name: str, instance_count: int, instance_type: str, runner: str) -> None:
    """Submission-time checks a backend may define (the Ray cluster exists and is big
    enough); raises a ShipyardError before anything of the job is written."""
    check = getattr(get(name), "validate", None)
    if check is not None:
        check(instance_count, instance_type, runner)
