"""The uvicorn the protocol is written against.

``protocol.GuardedProtocol`` subclasses uvicorn's httptools protocol and uses internals
(``Server._serve``, the protocol's cycle attributes, ``STATUS_LINE``) that a release may
change: constraints.txt pins exactly ``UVICORN_TESTED``, pyproject allows ``UVICORN_RANGE``
(tests/unit/http/test_version.py checks all three agree); any other installed release
logs one warning when a server starts, from every server alike.
"""

from __future__ import annotations

import logging

log = logging.getLogger("shipyard.http")

#: the release every test runs against (constraints.txt)
UVICORN_TESTED = "0.54.0"
#: the releases pyproject accepts: [lowest, below)
UVICORN_RANGE = ("0.54", "0.60")


def uvicorn_note(installed: str) -> str | None:
    """What to tell the operator when the installed uvicorn is not the tested one."""
    if installed == UVICORN_TESTED:
        return None
    return (
        f"shipyard's HTTP layer subclasses uvicorn's httptools protocol and is tested "
        f"with uvicorn {UVICORN_TESTED} only; uvicorn {installed} is installed. If requests "
        f"misbehave, install the tested one: pip install uvicorn=={UVICORN_TESTED}"
    )


def check_uvicorn() -> None:
    """Warn (once per server built) when the installed uvicorn is not the tested one."""
    import uvicorn

    note = uvicorn_note(uvicorn.__version__)
    if note:
        log.warning(note)
