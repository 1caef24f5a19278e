"""Which framework version a job runs: the asked one, or the nearest installable one with
the same API generation, and the sentence that says so.

Pure: the caller passes what the registry offers for this Python (versions with a wheel
that installs here) and what is installed; nothing is imported or downloaded. Why a
resolver of our own and not "the newest that installs": the scripts of the TF 2.4-era
notebooks use Keras 2 (``Adam(lr=...)``, ``metric.reset_states()``,
``optimizer.variables()``), which TensorFlow 2.16+ replaced with Keras 3. Running such a
script on the newest TensorFlow fails; running it on TF 2.15 or older works. So the API
generation decides first, and only then the distance in versions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Version = tuple[int, ...]


@dataclass(frozen=True)
class Generation:
    """A span of releases with one user-facing API (inclusive ``(major, minor)`` bounds)."""

    name: str
    low: tuple[int, int]
    high: tuple[int, int]

    def holds(self, v: Version) -> bool:
        return self.low <= (v[0], v[1] if len(v) > 1 else 0) <= self.high


@dataclass(frozen=True)
class Framework:
    """What the resolver knows of one framework."""

    display: str
    package: str  # the CPU build's distribution on the registry
    generations: tuple[Generation, ...]
    # the versions shipyard's in-instance parts (agent runners, horovod, ddp, ps, the TF
    # report) are tested with; outside it a job is refused rather than run untested
    supported: tuple[tuple[int, int], tuple[int, int]]
    index_url: str | None = None  # None: the default registry
    # releases before ``legacy_below`` are published under ``legacy_package`` (TensorFlow 1.x
    # and 2.0 as ``tensorflow``, CPU-only then: ``tensorflow-cpu`` begins with 2.1)
    legacy_package: str | None = None
    legacy_below: tuple[int, int] = (0, 0)
    # what a release older than the bound needs pinned beside it, which its own metadata
    # does not say: TensorFlow before 2.10 imports with protobuf 3 only
    pins: tuple[tuple[tuple[int, int], str], ...] = ()

    def package_for(self, v: Version) -> str:
        """The distribution a release ``v`` is published as."""
        if self.legacy_package and (v[0], v[1] if len(v) > 1 else 0) < self.legacy_below:
            return self.legacy_package
        return self.package

    def requirements_for(self, v: Version) -> tuple[str, ...]:
        """What an environment of release ``v`` installs: the release and its pins."""
        mm = (v[0], v[1] if len(v) > 1 else 0)
        return (f"{self.package_for(v)}=={_show(v)}",) + tuple(
            pin for below, pin in self.pins if mm < below
        )


FRAMEWORKS: dict[str, Framework] = {
    "tensorflow": Framework(
        display="TensorFlow",
        package="tensorflow-cpu",
        generations=(
            Generation("TensorFlow 1: graphs, sessions, tf.contrib", (1, 0), (1, 15)),
            Generation("Keras 2 as tf.keras", (2, 0), (2, 15)),
            Generation("Keras 3 as tf.keras", (2, 16), (2, 99)),
        ),
        supported=((2, 13), (2, 21)),
        legacy_package="tensorflow",
        legacy_below=(2, 1),
        pins=(((2, 10), "protobuf<3.21"),),
    ),
    "pytorch": Framework(
        display="PyTorch",
        package="torch",
        generations=(Generation("PyTorch 2", (2, 0), (2, 99)),),
        supported=((2, 0), (2, 13)),
        # PyPI's Linux torch pulls several GB of CUDA packages; this index has CPU builds
        index_url="https://download.pytorch.org/whl/cpu",
    ),
}


@dataclass(frozen=True)
class Resolution:
    """The outcome. ``version`` None: refused, ``reason`` says why and what to do.
    ``installed``: run in the installed environment (nothing to build). ``reason`` is also
    set when the version that runs is not the one asked (for the job log and describe)."""

    framework: str
    asked: str | None
    version: str | None
    installed: bool
    exact: bool
    reason: str | None = None
    requirements: tuple[str, ...] = field(default_factory=tuple)
    index_url: str | None = None
    # the CPython minor version (``"3.8"``) the environment is built in, when not shipyard's
    # own: the release has no wheel for it, and runs in the Python it was built for
    python: str | None = None


_VERSION = re.compile(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\+[\w.]+)?\s*$")


def parse(version: str) -> Version | None:
    """``"2.4.1"`` -> (2, 4, 1), ``"2.13"`` -> (2, 13), ``"2.21.0+cpu"`` -> (2, 21, 0);
    pre-releases and anything else -> None."""
    m = _VERSION.match(version)
    if m is None:
        return None
    return tuple(int(p) for p in m.groups() if p is not None)


def _show(v: Version) -> str:
    return ".".join(map(str, v))


def matches(asked: Version, have: Version) -> bool:
    """``2.13`` matches 2.13.x; ``2.13.1`` only 2.13.1 (missing parts are zeros)."""
    return have[: len(asked)] == asked or (
        len(have) < len(asked) and have + (0,) * (len(asked) - len(have)) == asked
    )


def _span(lo: tuple[int, int], hi: tuple[int, int]) -> str:
    return f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}"


def resolve(
    framework: str,
    asked: str | None,
    available: Iterable[str],
    installed: str | None,
    python: str,
    unreachable: str | None = None,
    elsewhere: Mapping[str, Iterable[str]] | None = None,
    py_asked: str | None = None,
) -> Resolution:
    """The version of ``framework`` a job asking for ``asked`` runs.

    ``available``: the versions the registry has a wheel of for this machine's Python
    (``python``, e.g. ``"3.11"``, only for the sentences). ``installed``: the version in
    shipyard's own environment (None: not installed). Order of preference: the installed
    one when it matches; the exact version (``2.13`` means its newest patch); the nearest
    minor release of the same API generation within shipyard's supported range (ties: the
    newer); nothing (refused, naming the generation and what the registry has).
    ``unreachable``: why the registry could not say what it has (``available`` is then
    empty): the installed release of the same API generation runs, and the reason says why.
    ``elsewhere``: the versions installable in the other Pythons of this machine (``"3.8"``
    -> versions); the exact version in one of those comes before any substitute (the one
    SageMaker's ``py_version`` names first, ``py_asked``, else the newest Python).
    """
    fw = FRAMEWORKS.get(framework)
    if fw is None or asked is None:
        return Resolution(framework, asked, installed, installed=True, exact=asked is None)
    want = parse(asked)
    if want is None:
        return Resolution(
            framework,
            asked,
            None,
            installed=False,
            exact=False,
            reason=(
                f"framework_version {asked!r} is not a {fw.display} release number such as "
                f"'{fw.supported[1][0]}.{fw.supported[1][1]}' or '2.4.1'"
            ),
        )
    have = parse(installed) if installed else None
    if have is not None and matches(want, have):
        return Resolution(framework, asked, installed, installed=True, exact=True)

    lo, hi = fw.supported
    offered = sorted({v for s in available if (v := parse(s)) is not None})
    pool = [v for v in offered if lo <= v[:2] <= hi]
    if have is not None and lo <= have[:2] <= hi and have not in pool:
        pool.append(have)  # the installed one is always at hand
        pool.sort()
    exact = [v for v in pool if matches(want, v)]
    if exact:
        return _chosen(fw, framework, asked, exact[-1], have, exact=True, reason=None)
    other = _exact_elsewhere(want, elsewhere or {}, py_asked)
    if other is not None:
        py, v = other
        return Resolution(
            framework,
            asked,
            _show(v),
            installed=False,
            exact=True,
            reason=(
                f"framework_version {asked!r}: {fw.package_for(v)} {_show(v)} has no wheel "
                f"for Python {python}; running it in Python {py}, which it was built for"
            ),
            requirements=fw.requirements_for(v),
            index_url=fw.index_url,
            python=py,
        )

    if unreachable:
        why = unreachable
    elif any(matches(want, v) for v in offered):
        why = f"outside shipyard's supported {fw.display} {_span(lo, hi)}"
    else:
        why = f"the registry has no {fw.package} {asked} for Python {python}"
    generation = next((g for g in fw.generations if g.holds(want)), None)
    if generation is None:
        return Resolution(
            framework,
            asked,
            None,
            installed=False,
            exact=False,
            reason=(
                f"framework_version {asked!r}: {why}, and no {fw.display} release of the "
                f"same API generation can run here; shipyard runs {fw.display} "
                f"{_span(lo, hi)} (ask for one of those)"
            ),
        )
    same = [v for v in pool if generation.holds(v)]
    if not same:
        return Resolution(
            framework,
            asked,
            None,
            installed=False,
            exact=False,
            reason=(
                f"framework_version {asked!r}: {why}, and none of the {fw.display} releases "
                f"this machine can install ({', '.join(map(_show, pool)) or 'none'}) has the "
                f"same API generation ({generation.name}); ask for one of those or change "
                "the script for a newer API"
            ),
        )
    minor = want[1] if len(want) > 1 else 0
    nearest_minor = min(
        {v[:2] for v in same},
        key=lambda mm: (abs(mm[1] - minor) + 100 * abs(mm[0] - want[0]), -mm[1]),
    )
    chosen = [v for v in same if v[:2] == nearest_minor][-1]
    return _chosen(
        fw,
        framework,
        asked,
        chosen,
        have,
        exact=False,
        reason=(
            f"framework_version {asked!r} asked: {why}; running {fw.display} {_show(chosen)}, "
            f"the nearest with the same API generation ({generation.name})"
        ),
    )


def python_key(py: str) -> tuple[int, ...]:
    """``"3.10"`` -> (3, 10): CPython minor versions in order (``"3.10"`` after ``"3.9"``)."""
    return tuple(int(p) for p in py.split("."))


def _exact_elsewhere(
    want: Version, elsewhere: Mapping[str, Iterable[str]], py_asked: str | None
) -> tuple[str, Version] | None:
    """(Python, release) of the asked version in another interpreter of this machine."""
    order = sorted(elsewhere, key=python_key, reverse=True)
    if py_asked is not None and py_asked in elsewhere:
        order.remove(py_asked)
        order.insert(0, py_asked)
    for py in order:
        found = sorted(v for s in elsewhere[py] if (v := parse(s)) is not None and matches(want, v))
        if found:
            return py, found[-1]
    return None


def _chosen(
    fw: Framework,
    framework: str,
    asked: str,
    version: Version,
    have: Version | None,
    exact: bool,
    reason: str | None,
) -> Resolution:
    shown = _show(version)
    if have is not None and version == have:
        return Resolution(framework, asked, shown, installed=True, exact=exact, reason=reason)
    return Resolution(
        framework,
        asked,
        shown,
        installed=False,
        exact=exact,
        reason=reason,
        requirements=fw.requirements_for(version),
        index_url=fw.index_url,
    )
