"""Session: which shipyard home and backend an estimator talks to.

``Session()`` uses SHIPYARD_HOME (default ~/.shipyard) and SHIPYARD_BACKEND (default
``local``), mirroring how a SageMaker session carries the region and client.
"""

from __future__ import annotations

import os
from typing import Optional

from shipyard.control.client import ControlPlane


class Session:
    def __init__(self, backend: Optional[str] = None, home: Optional[str] = None,
                 address: Optional[str] = None) -> None:
        self.backend = backend or os.environ.get("SHIPYARD_BACKEND", "local")
        if self.backend != "local":
            raise ValueError(f"backend {self.backend!r} is not available in this version; "
                             "use 'local' (the Ray backend comes with issue #9)")
        self.address = address
        self.control = ControlPlane(home=home, backend=self.backend)

    @property
    def home(self) -> str:
        return self.control.home.root

    def default_output_path(self) -> str:
        return self.control.home.default_output_path
