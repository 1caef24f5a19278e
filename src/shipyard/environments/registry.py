"""What the package registry has of a framework for this machine: the versions with a wheel
that installs here (this Python, this platform), the resolver's ``available``.

Read through the registry's simple API (PEP 691 JSON, which PyPI, the PyTorch index and
the usual mirrors serve): one small request per package, never the package list. The
filter is pure (:func:`installable_versions`) and tested on file names; the fetch is a thin
``urllib`` call whose every failure becomes a :class:`RegistryError` naming the package,
the index and the registry's answer, which is what a refused environment reports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from shipyard.errors import ShipyardError

DEFAULT_INDEX = "https://pypi.org/simple"
ACCEPT = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 30.0


class RegistryError(ShipyardError):
    """The registry could not say which versions exist (unreachable, unknown package...)."""


def index_url(explicit: str | None = None) -> str:
    """The index to ask: the framework's own (PyTorch's CPU index), else what uv or pip
    are configured with (``UV_INDEX_URL``, ``UV_DEFAULT_INDEX``, ``PIP_INDEX_URL``), else PyPI."""
    if explicit:
        return explicit.rstrip("/")
    for key in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(key):
            return os.environ[key].rstrip("/")
    return DEFAULT_INDEX


def installable_versions(filenames: Iterable[str], tags: Iterable[Any] | None = None) -> list[str]:
    """The final releases (no pre-releases) with at least one wheel among ``filenames``
    whose tags this interpreter supports (``packaging.tags.sys_tags()`` unless ``tags``
    is given), oldest first. Post-releases count as their version (``2.15.0.post1``)."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    supported = set(tags if tags is not None else sys_tags())
    found = set()
    for name in filenames:
        if not name.endswith(".whl"):
            continue
        try:
            _, version, _, wheel_tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if version.is_prerelease or version.is_devrelease or not (wheel_tags & supported):
            continue
        found.add(version.base_version)
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")))


def tags_for(minor: str) -> list[Any]:
    """The wheel tags a CPython ``minor`` (``"3.7"``) interpreter on this platform supports,
    computed here without starting it (its ABI is ``cp37m`` up to 3.7, ``cp38`` after)."""
    from packaging.tags import compatible_tags, cpython_tags, platform_tags

    major, minor_n = (int(p) for p in minor.split("."))
    version = (major, minor_n)
    abi = f"cp{major}{minor_n}" + ("m" if version < (3, 8) else "")
    platforms = list(platform_tags())
    return [
        *cpython_tags(version, abis=[abi], platforms=platforms),
        *compatible_tags(version, platforms=platforms),
    ]


def fetch_filenames(package: str, index: str) -> list[str]:
    """The file names the index lists for ``package`` (PEP 691 JSON)."""
    # imported here: urllib.request costs every job's submission ~35 ms, and only a job
    # that asks for a framework version not built yet queries an index
    import urllib.error
    import urllib.request

    url = f"{index}/{package}/"
    req = urllib.request.Request(url, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 - an index URL
            body = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise RegistryError(
            f"{package}: the registry at {index} answered HTTP {exc.code} ({exc.reason}) "
            f"for {url}" + (": no such package there" if exc.code == 404 else "")
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RegistryError(
            f"{package}: the registry at {index} could not be reached ({reason}); set "
            "UV_DEFAULT_INDEX or PIP_INDEX_URL to a reachable index, or ask for the "
            "installed version"
        ) from None
    except ValueError:
        raise RegistryError(
            f"{package}: the registry at {index} did not answer with the simple API's JSON "
            f"({ACCEPT}) for {url}"
        ) from None
    files = body.get("files") if isinstance(body, dict) else None
    if not isinstance(files, list):
        raise RegistryError(f"{package}: the registry at {index} listed no files for {url}")
    return [f["filename"] for f in files if isinstance(f, dict) and "filename" in f]


def available(package: str, index: str | None = None) -> list[str]:
    """The versions of ``package`` installable here, per the registry."""
    return installable_versions(fetch_filenames(package, index_url(index)))
