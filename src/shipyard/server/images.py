"""The SDK's image URIs -> shipyard frameworks.

``sagemaker.image_uris.retrieve`` gives ``<account>.dkr.ecr.<region>.amazonaws.com/
<repository>:<version>-<cpu|gpu>-py<NN>[...]``. The repository names the framework and
whether the image trains or serves; the tag carries the version and the Python. A training
job gets both as its framework_version / py_version, so it runs in a framework environment
of that version (shipyard.environments), as SageMaker runs it in that image; with framework
environments off, a version other than the installed one is logged once per version.
"""

from __future__ import annotations

import logging
import re

from shipyard.server.errors import validation

log = logging.getLogger("shipyard.server")
_REPOS = {
    "tensorflow-training": ("tensorflow", "training"),
    "tensorflow-inference": ("tensorflow", "inference"),
    "pytorch-training": ("pytorch", "training"),
    "pytorch-inference": ("pytorch", "inference"),
    "sagemaker-tensorflow-scriptmode": ("tensorflow", "training"),
    "sagemaker-tensorflow-serving": ("tensorflow", "inference"),
}
_URI = re.compile(r"^(?:[^/]+/)?(?P<repo>[a-z0-9\-]+)(?::(?P<tag>[\w.\-]+))?$")
_warned: set[tuple[str, str]] = set()


def supported() -> str:
    return ", ".join(sorted(_REPOS))


def parse(image: str, purpose: str) -> tuple[str, str | None]:
    """(framework, requested version) of an image URI, for ``purpose`` (training or
    inference); refuses, naming what is supported, an image shipyard cannot run."""
    match = _URI.match(image or "")
    found = _REPOS.get(match["repo"]) if match else None
    if not found or found[1] != purpose:
        wanted = [r for r, (_, p) in _REPOS.items() if p == purpose]
        raise validation(
            f"image {image!r} is not one shipyard can run for {purpose}; supported "
            f"repositories (from sagemaker.image_uris): {', '.join(sorted(wanted))}"
        )
    framework = found[0]
    version = match["tag"].split("-")[0] if match and match["tag"] else None
    _note_version(framework, version)
    return framework, version


def py_version(image: str) -> str | None:
    """The tag's Python (``2.4.1-cpu-py37`` -> ``py37``), None when it names none."""
    match = _URI.match(image or "")
    tag = match["tag"] if match and match["tag"] else ""
    return next((p for p in tag.split("-")[1:] if re.fullmatch(r"py\d+", p)), None)


def installed_version(framework: str) -> str | None:
    from importlib import metadata

    for dist in ("tensorflow-cpu", "tensorflow") if framework == "tensorflow" else ("torch",):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _note_version(framework: str, version: str | None) -> None:
    from shipyard.environments import job as framework_envs

    if not version or (framework, version) in _warned or framework_envs.enabled():
        return  # enabled: the job runs in an environment of the version, and its log says so
    _warned.add((framework, version))
    have = installed_version(framework)
    if have and not have.startswith(version):
        log.warning(
            "image asks for %s %s; shipyard runs the installed %s %s",
            framework,
            version,
            framework,
            have,
        )
