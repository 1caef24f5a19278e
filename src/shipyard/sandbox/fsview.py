"""What the job's processes see of this machine's filesystem (built by shipyard.sandbox.init).

A pure function of the instance's configuration and the agent's Python: which
directories are hidden (``$SHIPYARD_HOME``: other jobs' trees and secrets, a server's
store; ``/root`` and ``/home``), which paths under them stay reachable (the job's own
directory read-write; the Python environment, shipyard itself and local channel
sources read-only), which directories get a throw-away writable layer (``/etc``) and
which are read-only (the Python environment). Kept apart from the mounting so it is
tested as data.
"""

from __future__ import annotations

import os
import sys
from typing import Any

MASKED_HOMES = ("/root", "/home")
# an instance's own shared memory (as a container's): with a PID namespace per instance,
# ranks of two jobs' algo-1 have the same pids, and Open MPI's shared-memory transport
# names its segments in /dev/shm after them: one job's ranks wrote into the other's
# segments and both crashed (SIGSEGV in mca_btl_sm_poll_handle_frag)
PRIVATE_SHM = ("/dev/shm",)
OVERLAID = ("/etc",)
# bound by the agent into its own mount namespace (shipyard.sandbox.instance): bound
# again on top of the /etc overlay, which shows the host's files underneath
REBOUND = ("/etc/hosts", "/etc/resolv.conf")


def python_paths() -> list[str]:
    """The agent's interpreter, its environment and where shipyard is imported from."""
    import shipyard

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(shipyard.__file__))))
    # not the agent's working directory (sys.path[0] under ``python -m``): the user's
    paths.update(p for p in sys.path if p and p != os.getcwd() and os.path.isdir(p))
    return sorted(os.path.realpath(p) for p in paths)


def view(config: Any, python: list[str] | None = None) -> dict[str, list[str]]:
    """The view for an instance of the job ``config`` (an AgentConfig)."""
    job_dir = os.path.dirname(os.path.abspath(config.instances_dir))
    jobs = os.path.dirname(job_dir)  # <home>/jobs/<job>/instances
    home = [os.path.dirname(jobs)] if os.path.basename(jobs) == "jobs" else []
    keep_rw = [job_dir]
    if config.shared_dir:
        keep_rw.append(os.path.abspath(config.shared_dir))
    checkpoints = getattr(config, "checkpoint_local_path", None)
    if checkpoints and not os.path.abspath(checkpoints).startswith("/opt/ml"):
        keep_rw.append(os.path.abspath(checkpoints))  # shared by the job's instances
    local_channels = [
        source.removeprefix("file://")
        for source in config.channel_sources.values()
        if "://" not in source or source.startswith("file://")
    ]
    prefixes = python if python is not None else python_paths()
    # the job's framework environment (shipyard.environments), under the masked home
    framework_env = framework_environment(config)
    keep_ro = sorted({*prefixes, *config.extra_python_path, *local_channels, *framework_env})
    mask = [*home, *MASKED_HOMES, *PRIVATE_SHM]
    user_home = os.environ.get("HOME")
    if user_home and user_home != "/":
        mask.append(user_home)
    return {
        "overlay": list(OVERLAID),
        "rebind": list(REBOUND),
        "mask": _outermost(mask),
        "sticky": list(PRIVATE_SHM),  # masks every user writes to: mode 1777
        "keep_rw": [os.path.realpath(p) for p in keep_rw],
        "keep_ro": [os.path.realpath(p) for p in keep_ro],
        "read_only": sorted(
            {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *framework_env)}
        ),
    }


def framework_environment(config: Any) -> list[str]:
    """The root of the environment the job's processes run in, when it is not the agent's
    (``AgentConfig.python``: ``<env>/bin/python``)."""
    python = getattr(config, "python", None)
    if not python:
        return []
    return [os.path.dirname(os.path.dirname(os.path.abspath(python)))]


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without duplicates or paths inside another one of them."""
    real = sorted({os.path.realpath(p).rstrip("/") or "/" for p in paths})
    return [p for p in real if not any(p != q and p.startswith(q + "/") for q in real)]
