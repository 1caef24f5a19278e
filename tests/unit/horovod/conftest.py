"""One rank without mpirun: the engine on its size-1 channel."""

from __future__ import annotations

import pytest

import shipyard.horovod as hvd


@pytest.fixture
def single_rank(monkeypatch):
    """An initialized single-rank engine (no MPI launcher variables, no timeline)."""
    for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "HOROVOD_TIMELINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SHIPYARD_HOROVOD_BACKEND", "self")
    hvd.init()
    yield
    hvd.shutdown()
