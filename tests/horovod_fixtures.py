"""Fixtures both horovod test folders use (tests/unit/horovod, tests/integration/horovod):
each folder's conftest imports them, so there is one definition."""

from __future__ import annotations

import pytest


@pytest.fixture
def single_rank(monkeypatch):
    """An initialized single-rank engine (no MPI launcher variables, no timeline): the
    engine on its size-1 channel, without mpirun."""
    import shipyard.horovod as hvd

    for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "HOROVOD_TIMELINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SHIPYARD_HOROVOD_BACKEND", "self")
    hvd.init()
    yield
    hvd.shutdown()
