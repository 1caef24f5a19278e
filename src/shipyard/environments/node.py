"""A framework environment on a Ray node: built (or found in the node's cache) by the
instance actor before the agent starts, from the recipe the job's first phase wrote into
the agent config. The same builder, key, cache layout and lock as on the submitting
machine, so nodes sharing a cache directory build it once, and a node of its own builds
the very same environment.

Why on the node and not shipped: an environment is hundreds of MB of files hard-linked
from uv's cache, tied to the node's interpreter; the registry (or the node's index mirror)
is what every node can reach, and uv builds from its cache in seconds once it has the
wheels.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from shipyard.environments import builder
from shipyard.environments.job import DIR_SETTING, requirements_from_bundle


def cache_root(environ: Mapping[str, str]) -> str:
    """The node's cache: SHIPYARD_ENVIRONMENTS_DIR as the submitter forwards it, else the
    node's own shipyard home's."""
    from shipyard import settings

    explicit = settings.get(DIR_SETTING, environ) or settings.get(DIR_SETTING)
    if explicit:
        return explicit
    return os.path.join(os.path.expanduser(settings.text("SHIPYARD_HOME")), "environments")


def recipe(
    requirements: tuple[str, ...],
    deps: tuple[str, ...],
    index_url: str | None,
    user: bool,
    uv_env: Mapping[str, str] | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """What the agent config carries for the nodes (AgentConfig.framework_env): what to
    install, and uv's configuration on the submitting machine (``UV_*``: its index or
    mirror, offline mode), so every node builds the same way (default: this process's)."""
    if uv_env is None:
        uv_env = {k: v for k, v in os.environ.items() if k.startswith(builder.UV_PREFIX)}
    return {
        "requirements": list(requirements),
        "deps": list(deps),
        "index_url": index_url,
        "user_requirements": user,
        "uv_env": dict(uv_env),
        "python": python,  # the CPython minor version to build in; None: the node's own
    }


def on_node(config: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``config`` (the agent config, localized on this node) with ``python`` pointing at
    the framework environment its recipe names, built here on first use. Raises
    EnvironmentBuildError (naming the package and uv's answer): the instance does not
    start."""
    wanted = config.get("framework_env") or {}
    if not wanted:
        return config
    with tempfile.TemporaryDirectory(prefix="shipyard-reqs-") as scratch:
        user = (
            requirements_from_bundle(config["submit_directory"], scratch)
            if wanted.get("user_requirements")
            else None
        )
        env = builder.build(
            cache_root(environ),
            tuple(wanted["requirements"]),
            tuple(wanted["deps"]),
            wanted.get("index_url"),
            user,
            uv_env=wanted.get("uv_env"),
            python=wanted.get("python"),
        )
    return dict(config, python=env.python)
