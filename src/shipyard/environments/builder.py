"""Build (once) and find (every time after) a framework environment: a virtual environment
made by uv from the package registry, cached under a key and shared between jobs.

Why uv: it resolves and installs a framework's few hundred MB in seconds to minutes where
pip takes many, keeps one wheel cache that later environments hard-link from (a second
TensorFlow version costs its own wheels only), and is the installer Ray's runtime_env uses
for the same job. The environment gets the resolved requirement, the in-instance
dependencies shipyard's job-side code needs, and shipyard itself as a link to the package
in use, so the runners' rank wrappers, shipyard.horovod / ddp / ps and the TF report import
there unchanged.

Concurrency: a build runs under an ``flock`` on the key and writes a ``READY`` file last;
an environment without it is never used (a later build removes it). So two jobs asking for
the same version build it once and nobody runs in a half-built environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass

from shipyard.errors import ShipyardError

READY = "READY.json"
# what shipyard's job-side code imports besides the framework (the agent and the rank
# wrappers stay in the installed environment); numpy unpinned: the framework's own bounds
# decide. Not pydantic: TF 2.13 pins typing-extensions<4.6, which pydantic 2 cannot use.
RUNTIME_DEPS: tuple[str, ...] = ("numpy", "psutil")
_UV_TIMEOUT_S = 1800.0


class EnvironmentBuildError(ShipyardError):
    """The registry or the installer refused: the job fails before any instance starts."""


@dataclass(frozen=True)
class Environment:
    path: str
    python: str
    key: str
    built: bool  # False: found in the cache
    seconds: float


def uv_binary() -> str:
    """uv from the ``uv`` wheel in this environment, else on PATH."""
    try:
        import uv

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise EnvironmentBuildError(
        "framework environments are built with uv, which is not installed: "
        "pip install uv (or ask for the installed framework version)"
    )


def pinned_installed(distributions: Sequence[str]) -> tuple[str, ...]:
    """``name==version`` of those installed here (mpi4py must match the installed mpirun's
    Open MPI, so the environment gets the very versions the installed one has)."""
    from importlib import metadata

    out = []
    for dist in distributions:
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return tuple(out)


def env_key(requirements: Sequence[str], deps: Sequence[str], index_url: str | None) -> str:
    """The cache key: this Python, the platform, what is installed and from where."""
    blob = json.dumps(
        {
            "python": sys.version.split()[0],
            "platform": sysconfig.get_platform(),
            "requirements": sorted(requirements),
            "deps": sorted(deps),
            "index": index_url,
        },
        sort_keys=True,
    )
    name = "-".join(r.replace("==", "-") for r in requirements)[:60] or "env"
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _site_packages(env: str) -> str:
    v = sys.version_info
    return os.path.join(env, "lib", f"python{v.major}.{v.minor}", "site-packages")


def _run(argv: list[str], what: str, env: dict[str, str]) -> None:
    try:
        proc = subprocess.run(  # noqa: S603 - argv built here
            argv, capture_output=True, text=True, timeout=_UV_TIMEOUT_S, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentBuildError(
            f"{what}: uv did not finish within {_UV_TIMEOUT_S:.0f} s"
        ) from None
    if proc.returncode != 0:
        answer = "\n".join(
            ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()
        )[-1500:]
        raise EnvironmentBuildError(f"{what}: uv exited with {proc.returncode}:\n{answer}")


def build(
    root: str,
    requirements: Sequence[str],
    deps: Sequence[str] = RUNTIME_DEPS,
    index_url: str | None = None,
) -> Environment:
    """The environment holding ``requirements`` (+ ``deps`` and shipyard), built under
    ``root`` on first use, found there afterwards."""
    t0 = time.monotonic()
    key = env_key(requirements, deps, index_url)
    path = os.path.join(root, key)
    python = os.path.join(path, "bin", "python")
    if os.path.isfile(os.path.join(path, READY)):
        return Environment(path, python, key, built=False, seconds=time.monotonic() - t0)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f".{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job building the same key: wait for it
        if os.path.isfile(os.path.join(path, READY)):
            return Environment(path, python, key, built=False, seconds=time.monotonic() - t0)
        # built in place (entry-point scripts keep working paths), used only once READY
        shutil.rmtree(path, ignore_errors=True)  # an unfinished earlier build
        try:
            _build_into(path, requirements, deps, index_url)
            _write_ready(path, requirements, deps, index_url, time.monotonic() - t0)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
    return Environment(path, python, key, built=True, seconds=time.monotonic() - t0)


def _build_into(
    tmp: str, requirements: Sequence[str], deps: Sequence[str], index_url: str | None
) -> None:
    uv = uv_binary()
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    what = " ".join(requirements) or "the environment"
    # the same interpreter as the installed environment: no Python download, same ABI
    _run([uv, "venv", "--quiet", "--python", sys.executable, tmp], f"creating {what}", env)
    install = [uv, "pip", "install", "--quiet", "--python", os.path.join(tmp, "bin", "python")]
    if index_url:
        install += ["--index-url", index_url]
        # shipyard's own dependencies come from the default registry
        install += [
            "--extra-index-url",
            "https://pypi.org/simple",
            "--index-strategy",
            "unsafe-best-match",
        ]
    _run([*install, *requirements, *deps], f"installing {what}", env)
    # shipyard itself: a link to the package in use (source checkout or installed)
    import shipyard

    package = os.path.dirname(os.path.abspath(shipyard.__file__))
    os.symlink(package, os.path.join(_site_packages(tmp), "shipyard"))


def _write_ready(
    path: str,
    requirements: Sequence[str],
    deps: Sequence[str],
    index_url: str | None,
    seconds: float,
) -> None:
    tmp = os.path.join(path, READY + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(
            {
                "requirements": list(requirements),
                "deps": list(deps),
                "index_url": index_url,
                "python": sys.version.split()[0],
                "build_seconds": round(seconds, 1),
            },
            fh,
        )
    os.replace(tmp, os.path.join(path, READY))
