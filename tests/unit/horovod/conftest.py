"""One rank without mpirun: the engine on its size-1 channel."""

from __future__ import annotations

from tests.horovod_fixtures import single_rank  # noqa: F401 - the folder's fixture
