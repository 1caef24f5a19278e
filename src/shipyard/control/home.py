"""Where shipyard keeps its state: ``SHIPYARD_HOME`` (default ``~/.shipyard``).

$SHIPYARD_HOME/
  shipyard.db              the job store (SQLite, WAL)
  jobs/<job>/              one directory per job: job.json, agent.json, logs/,
                           instances/algo-k/ (the /opt/ml trees), shared/
  output/                  default output_path (model.tar.gz, output.tar.gz)
  cache/requirements/      requirements.txt installs, keyed by content hash

The home is the user's alone: created 0700 and tightened to it when found looser (an
older home, or one made by hand), with group and other bits dropped from everything
already in it once (``.private`` marks that done). Job records carry the job's
Environment (where users pass secrets), the S3 store holds every model and dataset: a
0700 root keeps other local users out of all of it, whatever the modes below it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from shipyard import settings

PRIVATE_MARK = ".private"
# what shipyard keeps in a home: only a directory holding some of these is walked
HOME_ENTRIES = frozenset(
    {"shipyard.db", "jobs", "s3", "server", "endpoints", "output", "cache", "envs"}
)


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

    def ensure_private(self) -> None:
        """Create the home 0700, or tighten an existing one (see the module docstring)."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        st = os.stat(self.root)
        if st.st_mode & stat.S_ISVTX or st.st_uid != os.geteuid():
            raise ValueError(
                f"SHIPYARD_HOME={self.root} is a shared directory (sticky, or owned by "
                "another user); point SHIPYARD_HOME at a directory of your own"
            )
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.root, 0o700)
        mark = os.path.join(self.root, PRIVATE_MARK)
        if os.path.exists(mark):
            return
        if set(os.listdir(self.root)) & HOME_ENTRIES:  # never walk a directory we did not make
            tighten(self.root)
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)


def tighten(root: str) -> None:
    """Drop group and other permission bits from everything under ``root`` (owner bits
    stay: an executable in a cached environment stays executable). Links are not
    followed; a file that vanishes meanwhile is skipped."""
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            try:
                mode = os.lstat(path).st_mode
                if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
                    os.chmod(path, stat.S_IMODE(mode) & 0o700)
            except OSError:
                continue
