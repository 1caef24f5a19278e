"""The Python interpreters on this machine a framework environment can be built in.

A framework version is built for a few Pythons (TensorFlow 1.13 for 3.3-3.7, 2.4 for
3.6-3.8): running a notebook's version exactly means running it in one of those. uv finds
interpreters on PATH and its own managed ones, but not pyenv's versions behind shims that
are not selected (every version but the global one, the usual pyenv set-up), so shipyard
looks where interpreters are installed: pyenv's versions, uv's managed Pythons, and
``pythonX.Y`` on PATH (shims excluded: they fail for an unselected version). Cheap: file
lookups only, no interpreter is started.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys

# the CPython minor versions looked for (what framework wheels were built for)
MINORS = tuple(f"3.{m}" for m in range(6, 14))
_VERSION_DIR = re.compile(r"^(\d+)\.(\d+)\.\d+$")


def this_python() -> str:
    """``"3.11"``: the interpreter shipyard runs in (the default environment's)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _pyenv_root() -> str:
    return os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")


def _uv_python_dir() -> str:
    explicit = os.environ.get("UV_PYTHON_INSTALL_DIR")
    if explicit:
        return explicit
    data = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(data, "uv", "python")


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _candidates(minor: str) -> list[str]:
    """Where an interpreter of ``minor`` may be, most specific first."""
    found = []
    # pyenv: <root>/versions/3.8.18/bin/python3.8 (the newest patch release first)
    versions = sorted(
        (
            d
            for d in glob.glob(os.path.join(_pyenv_root(), "versions", f"{minor}.*"))
            if _VERSION_DIR.match(os.path.basename(d))
        ),
        key=lambda d: int(os.path.basename(d).rsplit(".", 1)[1]),
        reverse=True,
    )
    found += [os.path.join(d, "bin", f"python{minor}") for d in versions]
    # uv's managed Pythons: <dir>/cpython-3.8.20-linux-x86_64-gnu/bin/python3.8
    found += sorted(
        glob.glob(os.path.join(_uv_python_dir(), f"cpython-{minor}.*", "bin", f"python{minor}")),
        reverse=True,
    )
    on_path = shutil.which(f"python{minor}")
    if on_path and f"{os.sep}shims{os.sep}" not in on_path:
        found.append(on_path)
    return found


def find(minor: str) -> str | None:
    """An interpreter of CPython ``minor`` (``"3.8"``) on this machine, or None."""
    if minor == this_python():
        return sys.executable
    return next((p for p in _candidates(minor) if _executable(p)), None)


def available() -> dict[str, str]:
    """Every CPython minor version found here -> its interpreter."""
    out = {}
    for minor in MINORS:
        path = find(minor)
        if path is not None:
            out[minor] = path
    return out


def from_py_version(py_version: str | None) -> str | None:
    """SageMaker's ``py_version`` (``"py37"``, ``"py310"``) -> ``"3.7"`` / ``"3.10"``;
    ``"py3"`` and anything else -> None (no particular minor version)."""
    m = re.fullmatch(r"py3(\d{1,2})", py_version or "")
    return f"3.{int(m.group(1))}" if m else None
