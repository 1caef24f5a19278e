"""Build (once) and find (every time after) a framework environment: a virtual environment
made by uv from the package registry, cached under a key and shared between jobs.

Why uv: it resolves and installs a framework's few hundred MB in seconds to minutes where
pip takes many, keeps one wheel cache that later environments hard-link from (a second
TensorFlow version costs its own wheels only), and is the installer Ray's runtime_env uses
for the same job. The environment gets the resolved requirement, the in-instance
dependencies shipyard's job-side code needs, and shipyard itself as a link to the package
in use, so the runners' rank wrappers, shipyard.horovod / ddp / ps and the TF report import
there unchanged.

Concurrency and cancellation: a build runs under an ``flock`` on the key, in a temporary
directory beside the cache (a relocatable venv) that is renamed into place, ``READY`` file
and all, when complete. So two jobs asking for the same version build it once, a build that
is stopped (StopTrainingJob, a kill) leaves only its temporary directory, which is removed
then or by the next build of that key under the lock, and nobody ever runs in a half-built
environment.

A job's ``requirements.txt`` goes into the same resolve as the framework (one environment
per framework and requirements hash): uv then refuses a requirement that conflicts with the
framework instead of silently replacing the framework's own numpy, say.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from shipyard.errors import ShipyardError

READY = "READY.json"
# what shipyard's job-side code imports besides the framework (the agent and the rank
# wrappers stay in the installed environment); numpy unpinned: the framework's own bounds
# decide. Not pydantic: TF 2.13 pins typing-extensions<4.6, which pydantic 2 cannot use.
RUNTIME_DEPS: tuple[str, ...] = ("numpy", "psutil")
_UV_TIMEOUT_S = 1800.0
_POLL_S = 0.2
_BUILDING = ".build-"  # prefix of a build's temporary directory under the cache root
UV_PREFIX = "UV_"  # uv's own configuration variables (index, offline, cache...)


class EnvironmentBuildError(ShipyardError):
    """The registry or the installer refused: the job fails before any instance starts."""


class BuildCancelled(ShipyardError):
    """The job was stopped while its environment was being built (or waited for)."""


ShouldStop = Callable[[], bool]


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


def requirements_digest(text: bytes | None) -> str | None:
    """The hash a job's requirements.txt adds to its environment's key (None: no file)."""
    return hashlib.sha256(text).hexdigest()[:16] if text is not None else None


def env_key(
    requirements: Sequence[str],
    deps: Sequence[str],
    index_url: str | None,
    user_requirements: str | None = None,
    python: str | None = None,
) -> str:
    """The cache key: the Python (this one, or the minor version ``python`` names), the
    platform, what is installed and from where, and the hash of the job's requirements.txt
    when it has one."""
    blob = json.dumps(
        {
            "python": sys.version.split()[0] if python is None else python,
            "platform": sysconfig.get_platform(),
            "requirements": sorted(requirements),
            "deps": sorted(deps),
            "index": index_url,
            **({"user": user_requirements} if user_requirements else {}),
        },
        sort_keys=True,
    )
    name = "-".join(r.replace("==", "-") for r in requirements if "==" in r)[:60] or "env"
    if python is not None:
        name += f"-py{python}"
    if user_requirements:
        name += "-req"
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _site_packages(env: str, python: str | None = None) -> str:
    minor = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    return os.path.join(env, "lib", f"python{minor}", "site-packages")


def interpreter(python: str | None) -> str:
    """The interpreter an environment is made from: this one, or one of CPython ``python``
    (``"3.7"``) on this machine (EnvironmentBuildError naming how to get one)."""
    if python is None:
        return sys.executable
    from shipyard.environments import interpreters

    found = interpreters.find(python)
    if found is None:
        raise EnvironmentBuildError(
            f"Python {python} is not on this machine (looked in pyenv's versions, uv's "
            f"managed Pythons and PATH): install it (`uv python install {python}` or `pyenv "
            f"install {python}`), or ask for a framework_version built for this Python"
        )
    return found


def _run(
    argv: list[str],
    what: str,
    env: dict[str, str],
    cwd: str | None = None,
    should_stop: ShouldStop | None = None,
) -> None:
    """Run uv; a stop request kills it (its whole process group) and raises BuildCancelled."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(  # noqa: S603 - argv built here
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        deadline = time.monotonic() + _UV_TIMEOUT_S
        try:
            while True:
                try:
                    code = proc.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if should_stop is not None and should_stop():
                    raise BuildCancelled(f"{what}: stopped while uv was running")
                if time.monotonic() > deadline:
                    raise EnvironmentBuildError(
                        f"{what}: uv did not finish within {_UV_TIMEOUT_S:.0f} s"
                    )
        finally:
            if proc.poll() is None:  # stopped, timed out or interrupted: uv goes too
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        if code != 0:
            out.seek(0)
            answer = "\n".join(ln for ln in out.read().strip().splitlines() if ln.strip())
            raise EnvironmentBuildError(f"{what}: uv exited with {code}:\n{answer[-1500:]}")


def _lock(lock_file: IO[str], should_stop: ShouldStop | None) -> None:
    """Take the key's lock, waiting for another job's build of it; a stop request ends
    the wait (BuildCancelled)."""
    fd = lock_file.fileno()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if should_stop is not None and should_stop():
                raise BuildCancelled("stopped while another job was building it") from None
            time.sleep(_POLL_S)


def build(
    root: str,
    requirements: Sequence[str],
    deps: Sequence[str] = RUNTIME_DEPS,
    index_url: str | None = None,
    user_requirements: str | None = None,
    should_stop: ShouldStop | None = None,
    uv_env: dict[str, str] | None = None,
    python: str | None = None,
) -> Environment:
    """The environment holding ``requirements`` (+ ``deps``, shipyard, and the job's
    ``requirements.txt`` at the path ``user_requirements``, resolved relative to its
    directory), built under ``root`` on first use, found there afterwards.

    ``should_stop``: polled while waiting for the lock and while uv runs; when it turns
    true the build is abandoned (BuildCancelled) and leaves nothing in the cache.
    ``uv_env``: uv's configuration (``UV_*``) to build with instead of this process's
    (a Ray node builds with the submitting machine's index settings). ``python``: the
    CPython minor version to build in (``"3.7"``), when not this interpreter's."""
    t0 = time.monotonic()
    digest = None
    if user_requirements is not None:
        with open(user_requirements, "rb") as fh:
            digest = requirements_digest(fh.read())
    key = env_key(requirements, deps, index_url, digest, python=python)
    path = os.path.join(root, key)
    env_python = os.path.join(path, "bin", "python")
    if os.path.isfile(os.path.join(path, READY)):
        return Environment(path, env_python, key, built=False, seconds=time.monotonic() - t0)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f".{key}.lock"), "w") as lock:
        _lock(lock, should_stop)  # another job building the same key: wait for it
        if os.path.isfile(os.path.join(path, READY)):
            return Environment(path, env_python, key, built=False, seconds=time.monotonic() - t0)
        # what an earlier build of this key left when it was killed (we hold its lock)
        for name in os.listdir(root):
            if name.startswith(_BUILDING + key + "."):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)  # an unfinished build of an older shipyard
        tmp = tempfile.mkdtemp(prefix=f"{_BUILDING}{key}.", dir=root)
        try:
            _build_into(
                tmp, requirements, deps, index_url, user_requirements, should_stop, uv_env, python
            )
            _write_ready(tmp, requirements, deps, index_url, digest, time.monotonic() - t0, python)
            os.rename(tmp, path)  # complete, or not there at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Environment(path, env_python, key, built=True, seconds=time.monotonic() - t0)


def _build_into(
    tmp: str,
    requirements: Sequence[str],
    deps: Sequence[str],
    index_url: str | None,
    user_requirements: str | None,
    should_stop: ShouldStop | None,
    uv_env: dict[str, str] | None = None,
    python: str | None = None,
) -> None:
    base = interpreter(python)
    uv = uv_binary()
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    if uv_env is not None:
        env = {k: v for k, v in env.items() if not k.startswith(UV_PREFIX)}
        env.update(uv_env)
    what = " ".join(requirements) or "the environment"
    # the installed environment's interpreter (no Python download, same ABI), or the one
    # of the Python the release was built for; relocatable: built in a temporary
    # directory, then renamed into the cache
    _run(
        [uv, "venv", "--quiet", "--relocatable", "--python", base, tmp],
        f"creating {what}",
        env,
        should_stop=should_stop,
    )
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
    cwd = None
    if user_requirements is not None:
        # relative lines (-r other.txt, ./pkg) mean what they mean in the job's source_dir
        cwd = os.path.dirname(os.path.abspath(user_requirements))
        install += ["-r", os.path.abspath(user_requirements)]
        what += " with the job's requirements.txt"
    # mpi4py from source (a Python it has no wheel for) is built once Open MPI is in
    wheels = [d for d in deps if d != MPI4PY_SOURCE]
    _run([*install, *requirements, *wheels], f"installing {what}", env, cwd, should_stop)
    if MPI4PY_SOURCE in deps:
        _mpi4py_from_source(tmp, install, env, should_stop)
    # shipyard itself: a link to the package in use (source checkout or installed)
    import shipyard

    package = os.path.dirname(os.path.abspath(shipyard.__file__))
    os.symlink(package, os.path.join(_site_packages(tmp, python), "shipyard"))


# mpi4py publishes wheels from Python 3.8 on; before, this dependency is built from source
# against the environment's Open MPI (the last series with Python 3.7 in its range)
MPI4PY_SOURCE = "mpi4py>=3.1,<4"


def _mpi4py_from_source(
    tmp: str, install: list[str], env: dict[str, str], should_stop: ShouldStop | None
) -> None:
    """mpi4py for a Python it has no wheel for (3.7: TensorFlow 1.x's Horovod scripts),
    compiled against the Open MPI wheel the environment just got (its ``mpicc`` and
    headers). The build bakes its directory into the library's RUNPATH, and uv caches the
    built wheel for later environments, so the library is found at run time through the
    environment's ``lib`` on ``LD_LIBRARY_PATH`` (shipyard.agent.environment sets it)."""
    bin_dir = os.path.join(tmp, "bin")
    build_env = dict(env, MPICC=os.path.join(bin_dir, "mpicc"))
    build_env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", os.defpath)])
    _run(
        [*install, MPI4PY_SOURCE],
        "building mpi4py against the environment's Open MPI (no wheel for this Python)",
        build_env,
        None,
        should_stop,
    )


def _write_ready(
    path: str,
    requirements: Sequence[str],
    deps: Sequence[str],
    index_url: str | None,
    user_requirements: str | None,
    seconds: float,
    python: str | None = None,
) -> None:
    tmp = os.path.join(path, READY + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(
            {
                "requirements": list(requirements),
                "deps": list(deps),
                "index_url": index_url,
                "user_requirements_sha256": user_requirements,
                "python": python or sys.version.split()[0],
                "build_seconds": round(seconds, 1),
            },
            fh,
        )
    os.replace(tmp, os.path.join(path, READY))
