"""Finding and joining the Ray cluster a job runs on (driver side).

The address comes from, in order: ``Session(address=...)`` / ``--ray-address``,
``SHIPYARD_RAY_ADDRESS``, ``RAY_ADDRESS``, then ``auto`` (the cluster ``ray start``
last started on this machine). Accepted forms: ``host:port`` (the GCS), ``ray://host:port``
(Ray Client) and ``auto``. The job store records it (backend ``ray@<address>``) so the
detached supervisor of ``fit(wait=False)`` reconnects to the same cluster.

Before ``ray.init`` the address is probed with a plain TCP connect of at most
SHIPYARD_RAY_PROBE_TIMEOUT seconds: an address with no cluster is refused at once with a clear
error instead of Ray's own retry loop (a minute or more).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import threading
from types import ModuleType

from shipyard import settings
from shipyard.errors import BackendError, ValidationError

NAMESPACE = "shipyard"
EXTRA_HINT = "pip install 'shipyard[ray]'"
_lock = threading.Lock()
_connected_to: str | None = None


def require_ray() -> None:
    """Refuse the Ray backend early (at Session creation) when Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        raise ValidationError(
            f"backend 'ray' needs the 'ray' package, which is not installed: {EXTRA_HINT}"
        )


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as exc:
        raise BackendError(f"backend 'ray' needs the 'ray' package ({exc}): {EXTRA_HINT}") from exc
    return ray


def resolve_address(address: str | None) -> str:
    return (
        address or settings.get("SHIPYARD_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS") or "auto"
    )


def _host_port(address: str) -> tuple[str, int] | None:
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def probe(address: str, timeout: float | None = None) -> None:
    """A bounded TCP connect to the address: the fast, clear 'no cluster here'."""
    if address == "auto":
        return
    if timeout is None:
        timeout = settings.number("SHIPYARD_RAY_PROBE_TIMEOUT")
    target = _host_port(address)
    if target is None:
        raise ValidationError(
            f"Ray address {address!r} is not valid: use host:port (the head's GCS, e.g. "
            "127.0.0.1:6379), ray://host:10001 (Ray Client) or 'auto'"
        )
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:
        raise BackendError(
            f"no Ray cluster answers at {address!r} ({exc.strerror or exc}; waited at most "
            f"{timeout:g} s): start one (`ray start --head`) or pass the address of a running "
            "cluster (Session(address=...), --ray-address or SHIPYARD_RAY_ADDRESS)"
        ) from None


def connect(address: str) -> ModuleType:
    """Join the cluster at ``address`` (once per process) and return the ``ray`` module."""
    global _connected_to
    ray = import_ray()
    with _lock:
        if ray.is_initialized():
            if _connected_to in (None, address) or address == "auto":
                return ray
            probe(address)  # before leaving the cluster we are connected to
            ray.shutdown()
        else:
            probe(address)
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise BackendError(f"could not join the Ray cluster at {address!r}: {exc}") from None
        _connected_to = address
    return ray
