"""Where shipyard keeps its state: ``SHIPYARD_HOME`` (default ``~/.shipyard``).

$SHIPYARD_HOME/
  shipyard.db              the job store (SQLite, WAL)
  jobs/<job>/              one directory per job: job.json, agent.json, logs/,
                           instances/algo-k/ (the /opt/ml trees), shared/
  output/                  default output_path (model.tar.gz, output.tar.gz)
  cache/requirements/      requirements.txt installs, keyed by content hash
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shipyard import settings


def default_home() -> str:
    return os.path.abspath(os.path.expanduser(settings.text("SHIPYARD_HOME")))


@dataclass(frozen=True)
class Home:
    root: str

    @classmethod
    def from_env(cls, root: str | None = None) -> Home:
        return cls(os.path.abspath(os.path.expanduser(root)) if root else default_home())

    @property
    def db_path(self) -> str:
        return os.path.join(self.root, "shipyard.db")

    def job_dir(self, job_name: str) -> str:
        return os.path.join(self.root, "jobs", job_name)

    def log_dir(self, job_name: str) -> str:
        return os.path.join(self.job_dir(job_name), "logs")

    def log_path(self, job_name: str, host: str) -> str:
        return os.path.join(self.log_dir(job_name), f"{host}.log")

    @property
    def default_output_path(self) -> str:
        return "file://" + os.path.join(self.root, "output")

    @property
    def requirements_cache(self) -> str:
        return os.path.join(self.root, "cache", "requirements")
