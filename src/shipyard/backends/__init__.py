"""Where instances run. ``local`` (processes on this machine) is the embedded default."""

from __future__ import annotations

from shipyard.backends.api import Backend


def get(name: str) -> Backend:
    if name == "local":
        from shipyard.backends.local import LocalBackend

        return LocalBackend()
    raise ValueError(f"unknown backend {name!r}; available: 'local'")
