"""ProcessSpecs shared by the TensorFlow runners: servers, relays and the environment.

Kept apart from the runners so both (tf_parameter_server, multi_worker_mirrored) plan
their relays and TensorFlow processes the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Literal

from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.runtime.traffic import peer_env
from shipyard.tf import cluster
from shipyard.tf.server import SECRET_ENV

# shipyard/tf/_hook, found by path so the agent never imports the tf package
HOOK_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tf", "_hook"
)
# TensorFlow's C++ logging: the toolkit's level for the user's script (INFO hidden),
# warnings hidden too for shipyard's own server processes, which only serve.
USER_LOG_LEVEL = "1"
SERVER_LOG_LEVEL = "2"


def user_env(ctx: InstanceContext, tf_config: str, label: str) -> dict[str, str]:
    env = dict(ctx.env)
    env["TF_CONFIG"] = tf_config
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", USER_LOG_LEVEL)
    env.update(peer_env(label))
    return env


def server_env(
    ctx: InstanceContext, tf_config: str | None, label: str, cpu_only: bool
) -> dict[str, str]:
    env = dict(ctx.env)
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    env["TF_CPP_MIN_LOG_LEVEL"] = ctx.config.environment.get(
        "TF_CPP_MIN_LOG_LEVEL", SERVER_LOG_LEVEL
    )
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    env[SECRET_ENV] = ctx.config.job_secret
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(peer_env(label))
    return env


def with_hook(env: dict[str, str]) -> dict[str, str]:
    """Put shipyard's TensorFlow ``sitecustomize`` (``_hook``) on the process's PYTHONPATH.

    Right after shipyard's job-process ``sitecustomize``, which chains to it; what it
    installs is chosen by environment variables (the placement recorder, the Keras
    multi-worker fix).
    """
    from shipyard.runtime import sitehooks

    parts = env.get("PYTHONPATH", "").split(os.pathsep)
    site = sitehooks.site_dir()
    at = parts.index(site) + 1 if site in parts else len(parts)
    env["PYTHONPATH"] = os.pathsep.join(parts[:at] + [HOOK_DIR] + parts[at:])
    return env


def relay_arg(name: str, public: tuple[str, int], private: tuple[str, int]) -> str:
    return f"{name}={public[0]}:{public[1]}>{private[0]}:{private[1]}"


def server_spec(
    ctx: InstanceContext,
    name: str,
    env: dict[str, str],
    *,
    serve: bool,
    cpu_only: bool = False,
    relays: Iterable[str] = (),
    role: Literal["main", "service"] = "service",
    critical: bool = True,
) -> ProcessSpec:
    failure_file = os.path.join(ctx.paths.agent_dir, f"{name.replace(':', '-')}.failure")
    argv = [
        # the job's interpreter: the server speaks the job's TensorFlow (a framework
        # environment's 1.13 or 2.4, not the agent's own release)
        ctx.config.python or sys.executable,
        "-m",
        "shipyard.tf.server",
        "--name",
        name,
        "--failure-file",
        failure_file,
    ]
    if serve:
        argv.append("--serve")
    if cpu_only:
        argv.append("--cpu-only")
    for relay in relays:
        argv += ["--relay", relay]
    return ProcessSpec(
        name=name,
        argv=argv,
        env=env,
        cwd=ctx.paths.code,
        role=role,
        user_facing=False,
        critical=critical,
        failure_file=failure_file,
    )


def private_ports(
    tasks: Iterable[cluster.Task], picker: Callable[[], int] = cluster.free_port
) -> dict[cluster.Task, int]:
    """A free port on this machine for each of this instance's tasks (see cluster.py)."""
    ports: dict[cluster.Task, int] = {}
    for task in tasks:
        port = picker()
        while port in ports.values():
            port = picker()
        ports[task] = port
    return ports
