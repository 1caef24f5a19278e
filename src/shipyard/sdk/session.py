"""Session: which shipyard home and backend an estimator talks to.

``Session()`` uses SHIPYARD_HOME (default ~/.shipyard) and SHIPYARD_BACKEND (default
``local``), mirroring how a SageMaker session carries the region and client.
``Session(backend='ray', address=...)`` runs jobs on a Ray cluster: the address is
``host:port``, ``ray://host:port`` or ``auto`` (default: SHIPYARD_RAY_ADDRESS, then
RAY_ADDRESS, then ``auto``); see shipyard.backends.ray.
"""

from __future__ import annotations

import os

from shipyard.control.client import ControlPlane
from shipyard.errors import ValidationError

BACKENDS = ("local", "ray")


class Session:
    def __init__(
        self, backend: str | None = None, home: str | None = None, address: str | None = None
    ) -> None:
        self.backend = backend or os.environ.get("SHIPYARD_BACKEND", "local")
        if self.backend not in BACKENDS:
            raise ValidationError(
                f"unknown backend {self.backend!r}; available: "
                + ", ".join(repr(b) for b in BACKENDS)
            )
        self.address = address
        name = self.backend
        if self.backend == "ray":
            from shipyard.backends.ray.connect import require_ray, resolve_address

            require_ray()
            self.address = resolve_address(address)
            name = f"ray@{self.address}"
        elif address is not None:
            raise ValidationError("address= is for backend='ray'; the local backend has none")
        self.control = ControlPlane(home=home, backend=name)

    @property
    def home(self) -> str:
        return self.control.home.root

    def default_output_path(self) -> str:
        return self.control.home.default_output_path
