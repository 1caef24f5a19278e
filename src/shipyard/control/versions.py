"""``framework_version`` and ``py_version`` against what is installed.

SageMaker picks a container for them; shipyard runs the script with the framework and the
Python of this environment, whatever was asked. Accepting a different version silently
hides why a script written for TF 2.3 or Python 3.8 behaves differently, so submission
logs one line saying what will run instead. Reads package metadata only: no framework
is imported.
"""

from __future__ import annotations

import sys
from importlib import metadata

# estimator framework -> (display name, distributions that provide it, extra to install)
FRAMEWORKS = {
    "tensorflow": ("TensorFlow", ("tensorflow", "tensorflow-cpu"), "shipyard[tensorflow]"),
    "pytorch": ("PyTorch", ("torch",), "shipyard[torch]"),
}


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _matches(asked: str, installed: str) -> bool:
    """``2.13`` matches 2.13.x; ``2.13.0`` matches 2.13.0 (local tags such as +cpu aside)."""
    have = installed.split("+", 1)[0].split(".")
    want = asked.strip().split(".")
    return have[: len(want)] == want


def notes(
    framework: str | None, framework_version: str | None, py_version: str | None
) -> list[str]:
    """At most one line saying what runs instead of what was asked; [] when it matches."""
    if framework not in FRAMEWORKS or not (framework_version or py_version):
        return []
    name, distributions, extra = FRAMEWORKS[framework]
    version = next((v for d in distributions if (v := installed_version(d)) is not None), None)
    if version is None:
        return [
            f"framework_version {framework_version!r}: {name} is not installed in this "
            f"environment; the script will fail to import it (pip install '{extra}')"
        ]
    here = f"py{sys.version_info.major}{sys.version_info.minor}"
    differ = []
    if framework_version and not _matches(framework_version, version):
        differ.append(f"framework_version {framework_version!r}")
    if py_version and py_version.strip().lower() != here:
        differ.append(f"py_version {py_version!r}")
    if not differ:
        return []
    return [
        f"{' and '.join(differ)} asked; the script runs with this environment's {name} "
        f"{version} on Python {sys.version_info.major}.{sys.version_info.minor} "
        "(shipyard runs what is installed, not a container of the asked versions)"
    ]
