"""What the job's processes see of this machine's filesystem (built by shipyard.sandbox.init).

A pure function of the instance's configuration and the agent's Python, kept apart from
the mounting so it is tested as data:

* the whole system read-only with a writable layer thrown away with the instance (an
  overlay over the host's root, ``root_overlay``; where the kernel refuses one, the
  ``overlay`` fallback gives the usual writable places such a layer): scripts writing
  ``~/.keras``, ``/etc/...`` or ``/usr/local/...`` run, nothing lands on the host;
* hidden (``mask``, an empty tmpfs each): ``$SHIPYARD_HOME`` (other jobs' trees and
  secrets, a server's store), ``/root``, ``/home``, the user's home; and a private
  ``/tmp`` and ``/dev/shm`` (``private_tmp``, ``sticky``: mode 1777), as a container's;
* reachable again (``keep_rw``, ``keep_ro``): the job's own directory, its shared and
  checkpoint directories and the host paths the job's spec names under ``/tmp`` or a
  hidden directory (its environment and hyperparameters: scripts are handed such paths,
  and two instances may share one) read-write; the Python environment, shipyard itself,
  and local channel sources read-only (the source directory is not: the agent copies
  it to ``/opt/ml/code``, the only place a script finds its code on SageMaker);
* ``read_only``: the Python environment, bound read-only over itself (a write fails
  rather than vanishing: a script that ``pip install``s learns it at once);
* ``devices``: what the instance's own ``/dev`` holds of the host's (no disks);
* ``writable``: the instance's own mounts the read-only pass leaves alone (``/opt/ml``,
  ``/etc/hosts``, ``/etc/resolv.conf``, ``/dev``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from shipyard.sandbox import masks

MASKED_HOMES = ("/root", "/home")
# an instance's own shared memory and /tmp (as a container's): with a PID namespace per
# instance, ranks of two jobs' algo-1 have the same pids, and Open MPI names its
# shared-memory segments (/dev/shm) and PMIx session directories (/tmp) after them: one
# job's ranks wrote into the other's segments and both crashed
PRIVATE_SHM = ("/dev/shm",)
PRIVATE_TMP = "/tmp"
# where the kernel refuses an overlay root: the places scripts usually write
OVERLAID = ("/etc", "/usr/local", "/var", "/srv")
# the instance's own files, bound by the agent (shipyard.sandbox.instance), and its own
# /dev: left writable
OWN_MOUNTS = ("/opt/ml", "/etc/hosts", "/etc/resolv.conf", "/dev")
# the host's devices an instance's /dev holds (glob patterns): no disks; the GPUs (the
# device cgroup, where there is one, denies those of other instances), InfiniBand
DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "nvidia*", "infiniband")


def python_paths() -> list[str]:
    """The agent's interpreter, its environment and where shipyard is imported from."""
    import shipyard

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(shipyard.__file__))))
    # not the agent's working directory (sys.path[0] under ``python -m``): the user's
    paths.update(p for p in sys.path if p and p != os.getcwd() and os.path.isdir(p))
    return sorted(os.path.realpath(p) for p in paths)


def view(config: Any, python: list[str] | None = None) -> dict[str, Any]:
    """The view for an instance of the job ``config`` (an AgentConfig)."""
    job_dir = os.path.dirname(os.path.abspath(config.instances_dir))
    jobs = os.path.dirname(job_dir)  # <home>/jobs/<job>/instances
    home = [os.path.dirname(jobs)] if os.path.basename(jobs) == "jobs" else []
    # the instances' trees (a runner hands a peer's tree to its processes: TF's ps tasks,
    # mpi's run dir), not the job's records beside them: agent.json, logs/, utilization
    # are read and written by the host as root, out of the job's reach (issue 37)
    keep_rw = [os.path.abspath(config.instances_dir)]
    if config.shared_dir:
        keep_rw.append(os.path.abspath(config.shared_dir))
    # paths the spec names are bound only where the spec may name this machine's
    # directories (the SDK and CLI; never a job created through the server's API), and
    # never one the instances may not see (``hidden``: issue 37)
    host_paths = getattr(config, "host_paths", True)
    checkpoints = getattr(config, "checkpoint_local_path", None)
    if (
        checkpoints
        and host_paths
        and not os.path.abspath(checkpoints).startswith("/opt/ml")
        and not hidden(checkpoints, home)
    ):
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
    secret = [*home, *MASKED_HOMES]
    user_home = os.environ.get("HOME")
    if user_home and user_home != "/":
        secret.append(user_home)
    # under the private /tmp a home is not there anyway
    mask = [m for m in _outermost([*secret, *PRIVATE_SHM]) if not _inside(m, PRIVATE_TMP)]
    # a path under /tmp the spec names, unless it is a home or holds one (the job's own
    # directory in $SHIPYARD_HOME is kept already)
    keep_rw += [
        p
        for p in (named_paths(config) if host_paths else [])
        if _inside(p, PRIVATE_TMP) and not hidden(p, secret)
    ]
    return {
        "root_overlay": True,
        "overlay": list(OVERLAID),
        "mask": mask,
        "private_tmp": [PRIVATE_TMP],
        "sticky": [*PRIVATE_SHM, PRIVATE_TMP],  # masks every user writes to: mode 1777
        "keep_rw": sorted({os.path.realpath(p) for p in keep_rw}),
        "keep_ro": sorted({os.path.realpath(p) for p in keep_ro} - {"/"}),
        "read_only": sorted(
            {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *framework_env)}
        ),
        "writable": list(OWN_MOUNTS),
        "devices": list(DEVICES),
        # the job's SHIPYARD_HOME: its own trees inside are reached, nothing is listed
        "sealed": sorted({os.path.realpath(h) for h in home}),
        # masked /proc paths, host secrets, the instance's own /run (shipyard.sandbox.masks)
        **masks.view_keys(),
    }


def named_paths(config: Any) -> list[str]:
    """Host paths the job's spec hands its processes (values of its environment and
    hyperparameters that are absolute paths; hyperparameters arrive JSON-encoded). A path
    that does not exist yet (an output something else will create while the job runs)
    stands for its nearest existing directory, so it is reachable once it appears. A list
    such as ``PATH`` is not one path and is left out."""
    values = list(getattr(config, "environment", {}).values())
    for value in getattr(config, "hyperparameters", {}).values():
        try:
            decoded = json.loads(value)
        except (TypeError, ValueError):
            decoded = value
        values.append(decoded)
    return sorted(
        {
            _existing(v)
            for v in values
            if isinstance(v, str) and v.startswith("/") and ":" not in v and "\n" not in v
        }
    )


# what marks a directory holding shipyard's state (a SHIPYARD_HOME: its jobs' records,
# a server's store and keys), found where a spec names a path, above it or one level below
STATE_MARKS = ("shipyard.db", ".private", "server/credentials.json", "jobs/*/agent.json")


def hidden(path: str, secret: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether the instances may never see ``path`` because a spec names it: it is,
    is inside or holds a home (``secret``, the users' homes, ``$HOME``) or a directory
    holding shipyard's state (another ``SHIPYARD_HOME``, by its ``STATE_MARKS``)."""
    import glob

    path = os.path.realpath(path)
    homes = [*secret, *MASKED_HOMES, os.environ.get("HOME") or "/"]
    tops = {os.path.realpath(h) for h in homes if h and os.path.realpath(h) != "/"}
    if any(nested(path, t) or nested(t, path) for t in tops):
        return True
    places = [path, *glob.glob(os.path.join(glob.escape(path), "*", ""))]
    above = path
    while os.path.dirname(above) != above:
        above = os.path.dirname(above)
        places.append(above)
    return any(
        glob.glob(os.path.join(glob.escape(place), mark))
        for place in places
        for mark in STATE_MARKS
    )


def _existing(path: str) -> str:
    """``path``, or its nearest ancestor that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def nested(path: str, top: str) -> bool:
    """``path`` is ``top`` or below it."""
    return path == top or _inside(path, top)


def _inside(path: str, top: str) -> bool:
    """``path`` is strictly below ``top`` (``top`` itself is never bound back)."""
    return os.path.abspath(path).startswith(top.rstrip("/") + "/")


def framework_environment(config: Any) -> list[str]:
    """The root of the environment the job's processes run in, when it is not the agent's
    (``AgentConfig.python``: ``<env>/bin/python``)."""
    python = getattr(config, "python", None)
    if not python:
        return []
    root = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    # and the interpreter the environment was made from (pyvenv.cfg's ``home``): for a
    # release built for another Python (TensorFlow 1.13 in 3.7) it is not the agent's, and
    # pyenv keeps it under a masked home
    try:
        with open(os.path.join(root, "pyvenv.cfg"), encoding="utf-8") as fh:
            home = next(
                (v.strip() for k, _, v in (ln.partition("=") for ln in fh) if k.strip() == "home"),
                "",
            )
    except OSError:
        home = ""
    return [root, os.path.dirname(home)] if os.path.isabs(home) else [root]


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without duplicates or paths inside another one of them."""
    real = sorted({os.path.realpath(p).rstrip("/") or "/" for p in paths})
    return [p for p in real if not any(p != q and p.startswith(q + "/") for q in real)]
