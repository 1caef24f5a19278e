"""The SDK's image URIs -> shipyard frameworks.

``sagemaker.image_uris.retrieve`` gives ``<account>.dkr.ecr.<region>.amazonaws.com/
<repository>:<version>-<cpu|gpu>-py<NN>[...]``. The repository names the framework and
whether the image trains or serves; the tag carries the version. shipyard runs the
framework installed here: a different requested version is logged once per version.
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


def installed_version(framework: str) -> str | None:
    from importlib import metadata

    for dist in ("tensorflow-cpu", "tensorflow") if framework == "tensorflow" else ("torch",):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _note_version(framework: str, version: str | None) -> None:
    if not version or (framework, version) in _warned:
        return
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
