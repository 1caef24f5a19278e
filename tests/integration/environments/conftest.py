"""What the framework-environment tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def python_3_7() -> str:
    """pyenv's (or uv's) Python 3.7, the one TensorFlow 1.13 and the workshop's 2.4.1 run in
    here; a machine without it skips, naming how to get one."""
    from shipyard.environments import interpreters

    found = interpreters.find("3.7")
    if found is None:
        pytest.skip("no Python 3.7 on this machine (pyenv install 3.7 or uv python install 3.7)")
    return found
