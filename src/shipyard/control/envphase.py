"""The job's first phase: its framework environment, prepared before any instance starts.

Why a phase of the job and not part of submission: building an environment takes minutes on
first use, longer than CreateTrainingJob may take to answer (the SDK's read timeout) and
longer than a user expects ``fit(wait=False)`` to block. So submission records the request
(``environments.job.request``) and returns; the supervisor runs this phase first, with the
job InProgress/Downloading and a StatusMessage naming the environment, and the job log
saying it. A refused version or a failed build fails the job here, before any instance
starts, with a FailureReason naming the package and the registry's or uv's answer; a stop
request (StopTrainingJob, a kill) abandons the build (nothing half-built is left) and the
job ends Stopped.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace

from shipyard.control.reading import (  # describe reads it from there
    FRAMEWORK_ENV_NAME,
    framework_environment,
)
from shipyard.environments import job as framework_envs
from shipyard.environments import node
from shipyard.environments.builder import BuildCancelled, EnvironmentBuildError
from shipyard.errors import ShipyardError
from shipyard.jobplan.config import AgentConfig

REQUEST_NAME = "framework-environment.request.json"
REASON_LIMIT = 1024


@dataclass(frozen=True)
class Outcome:
    """How the phase ended: ``stopped``, or ``failure`` (the FailureReason), or neither."""

    stopped: bool = False
    failure: str | None = None


def write_request(job_dir: str, req: framework_envs.Request) -> None:
    """At submission: what the first phase prepares, and describe's view until then."""
    _write_json(os.path.join(job_dir, REQUEST_NAME), req.to_json())
    _write_json(os.path.join(job_dir, FRAMEWORK_ENV_NAME), req.describe())


def pending(job_dir: str) -> framework_envs.Request | None:
    try:
        with open(os.path.join(job_dir, REQUEST_NAME), encoding="utf-8") as fh:
            return framework_envs.Request.from_json(json.load(fh))
    except FileNotFoundError:
        return None


def run(
    job_dir: str,
    cache_root: str,
    bundle_path: str | None,
    status: Callable[[str], object],
    log: Callable[[str], None],
    should_stop: Callable[[], bool],
    on_nodes: bool = False,
) -> Outcome:
    """Prepare the job's environment if it asked for one; point its agents at it.

    ``status(message)``: the job's StatusMessage (a Downloading transition); ``log(line)``:
    the job log; ``should_stop()``: polled while waiting for and during the build.
    ``on_nodes`` (Ray): resolve here, and leave the build to each node's instance actor
    (environments.node), which builds or finds the same environment before its agent
    starts; the agent config carries the recipe."""
    req = pending(job_dir)
    if req is None:
        return Outcome()
    what = f"{req.framework} framework_version {req.asked!r}"
    try:
        found = framework_envs.resolution(req, None if on_nodes else cache_root)
        with tempfile.TemporaryDirectory(prefix="shipyard-reqs-") as scratch:
            reqs = framework_envs.requirements_from_bundle(bundle_path, scratch)
            env_name = " ".join(framework_envs.requirements_of(found))
            if reqs is not None:
                env_name += " + the job's requirements.txt"
            if found.installed and reqs is None:
                message = f"Running the installed {found.framework} {found.version} ({what})"
            elif on_nodes:
                message = (
                    f"Resolved the framework environment {env_name} ({what}); each node "
                    "builds it, or finds it in its cache, before its instance starts"
                )
            elif framework_envs.is_cached(found, cache_root, reqs):
                message = f"Using the cached framework environment {env_name} ({what})"
            else:
                message = (
                    f"Building the framework environment {env_name} with uv ({what}; "
                    "first use, cached for later jobs)"
                )
            status(message)
            log(message)
            if found.reason:
                log(found.reason)
            if on_nodes and not (found.installed and reqs is None):
                _point_agents(
                    job_dir,
                    None,
                    node.recipe(
                        *framework_envs.build_args(found), reqs is not None, python=found.python
                    ),
                )
                _write_json(
                    os.path.join(job_dir, FRAMEWORK_ENV_NAME),
                    framework_envs.Prepared(None, found.reason, found).describe(),
                )
                os.unlink(os.path.join(job_dir, REQUEST_NAME))
                return Outcome()
            prepared = framework_envs.prepare(found, cache_root, reqs, should_stop)
            framework_envs.remember(found, req, cache_root)
    except BuildCancelled:
        log("framework environment: stopped before it was ready; nothing was kept")
        return Outcome(stopped=True)
    except ShipyardError as exc:
        reason = f"ClientError: the framework environment for {what} could not be prepared: {exc}"
        log(reason)
        return Outcome(failure=reason[:REASON_LIMIT])
    _point_agents(job_dir, prepared.python)
    _write_json(os.path.join(job_dir, FRAMEWORK_ENV_NAME), prepared.describe())
    os.unlink(os.path.join(job_dir, REQUEST_NAME))
    if prepared.note:
        log(prepared.note)
    if prepared.python:
        log(f"the job's processes run in the framework environment {prepared.python}")
    return Outcome()


def node_failure(exc: BaseException) -> str | None:
    """The FailureReason when a backend's launch failed because a node could not build the
    job's framework environment (Ray wraps the node's EnvironmentBuildError in its task
    error, whose ``cause`` is the original), else None."""
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, EnvironmentBuildError):
        cause = cause.__cause__
    if cause is None:
        return None
    original = getattr(cause, "cause", None)
    text = str(original if isinstance(original, EnvironmentBuildError) else cause)
    reason = f"ClientError: the framework environment could not be built on a node: {text}"
    return reason[:REASON_LIMIT]


def substitution_note(job_dir: str) -> str | None:
    """One line for a failed job's FailureReason when its framework version was not the one
    asked (the nearest of the same API generation ran): the script may have failed for that
    very difference, and the reason is what most users read, not the log or describe."""
    env = framework_environment(job_dir)
    if env is None or env.get("Exact") is not False or not env.get("Version"):
        return None
    return (
        f"Framework: {env.get('Framework')} {env['Version']} ran, not the asked "
        f"framework_version {env.get('Asked')!r} (the nearest with the same API that installs "
        "here; describe's Shipyard.FrameworkEnvironment says why)"
    )


def _point_agents(job_dir: str, python: str | None, recipe: dict | None = None) -> None:
    """agent.json gets the environment's interpreter, or (Ray) the recipe each node builds
    it from (the file holds the job's secret: rewritten in place of the old one,
    owner-only)."""
    path = os.path.join(job_dir, "agent.json")
    config = replace(AgentConfig.load(path), python=python, framework_env=recipe or {})
    tmp = path + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(config.to_json())
    os.replace(tmp, path)


def _write_json(path: str, data: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)
