"""agent.json as it was submitted: the supervisor's own copy of a job's plan.

The backend, the Ray actors and every agent (``python -m shipyard.agent --config``) read a
job's plan from ``<job>/agent.json``. The file lies outside every instance's view; the
supervisor still reads it once, never through a link, and puts that copy back before
each launch: a retry runs the job that was submitted, whatever changed the file
meanwhile (a job could once rewrite it and run attempt 2 with the sandbox off, issue 37).
"""

from __future__ import annotations

import os

from shipyard.jobplan.config import AgentConfig
from shipyard.runtime import safepath


def _read(path: str, missing_ok: bool = False) -> bytes:
    """The file's bytes, never through a link (b"" when absent or a link and ``missing_ok``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        if missing_ok:
            return b""
        raise
    with open(fd, "rb") as fh:
        return fh.read()


class SubmittedPlan:
    """``agent.json`` read once; ``restore`` before every launch."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data = _read(path)

    def config(self) -> AgentConfig:
        return AgentConfig.from_json(self.data.decode("utf-8"))

    def restore(self) -> bool:
        """Put the submitted plan back if the file differs (0600: it holds the job's
        secret); returns whether it had to."""
        if _read(self.path, missing_ok=True) == self.data:
            return False
        directory = os.path.dirname(self.path)
        safepath.write_text(directory, self.path, self.data.decode("utf-8"), mode=0o600)
        return True
