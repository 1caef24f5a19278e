"""A failing serving test must not leave endpoint servers running: after each test that
uses a shipyard home, every endpoint recorded there is deleted (stopping its processes)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _delete_leftover_endpoints(request):
    home = request.getfixturevalue("home") if "home" in request.fixturenames else None
    yield
    if home is None:
        return
    from shipyard.control.endpoints import Endpoints

    endpoints = Endpoints(str(home))
    for record in endpoints.list():
        endpoints.delete(record.name)
