"""Creates racing on one endpoint name, from separate processes (a notebook and a CLI,
say): exactly one wins, the others get a clear ValidationError and leave the winner's
directory and record alone.

Before the fix all passed the name check, a loser's ``os.makedirs`` raised a raw
FileExistsError, and its cleanup deleted the directory the winner was staging into.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

from shipyard.control.endpoints import Endpoints
from tests.integration.serving.serving_helpers import torchscript_archive

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

RACERS = 4


def _racer(home: str, archive: str, barrier, results) -> None:  # type: ignore[no-untyped-def]
    endpoints = Endpoints(home)
    barrier.wait()
    try:
        results.put(("won", endpoints.create("race-ep", archive, framework="pytorch").name))
    except BaseException as exc:  # noqa: BLE001 - every outcome is reported and asserted
        results.put((type(exc).__name__, str(exc)))


def test_concurrent_creates_of_one_name_leave_one_intact_endpoint(home, tmp_path):
    archive, _ = torchscript_archive(str(tmp_path / "m"))
    Endpoints(str(home)).list()  # the store exists before the race, as in real use
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(RACERS), ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(str(home), archive, barrier, results))
        for _ in range(RACERS)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    endpoints = Endpoints(str(home))
    try:
        winners = [o for o in outcomes if o[0] == "won"]
        losers = [o for o in outcomes if o[0] != "won"]
        assert len(winners) == 1, outcomes
        assert all(kind == "ValidationError" and "race-ep" in msg for kind, msg in losers), losers
        record = endpoints.wait("race-ep")
        assert record.status == "InService"
        assert os.path.isdir(os.path.join(record.endpoint_dir, "model"))
    finally:
        endpoints.delete("race-ep")
