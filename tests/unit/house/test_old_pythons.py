"""shipyard's in-job parts run in the framework environment's interpreter: Python 3.7 for
TensorFlow 1.13, 3.8 for TensorFlow 2.4 (issue 38), while the rest of shipyard is 3.11.

For each of Python 3.7 and 3.8 found on the machine (pyenv's ``~/.pyenv/versions/3.7.*``,
or ``python3.7`` on PATH), one subprocess with ``PYTHONPATH=src``:

* compiles every module of the in-job packages (syntax: no walrus, match, positional-only
  parameters, ``f"{x=}"``, parenthesized context managers on 3.7);
* imports every one of them, so what runs at import time fails here: ``typing.Literal`` /
  ``Protocol`` / ``TypedDict`` outside ``if TYPE_CHECKING:``, a subscripted
  ``collections.abc.Callable`` or ``dict[...]`` or an ``X | Y`` union in a module-level
  alias, ``dataclass(slots=True)``. numpy and psutil, when that interpreter lacks them,
  are stand-ins (the modules use them in functions); a module that needs a framework the
  interpreter lacks (tensorflow, torch, keras, mpi4py) is skipped, not failed;
* runs the two job-process ``sitecustomize`` hooks and imports the ``horovod``,
  ``smdistributed`` and ``sagemaker_tensorflow`` shims from their directories.

What only runs later (``math.prod``, ``str.removeprefix``, ``shlex.join`` in a function)
is not seen here; the framework environments' own tests run those paths.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SRC = ROOT / "src"
PACKAGES = ("tf", "horovod", "mpi", "ddp", "ps", "data", "runtime")
#: the importable stand-ins of other projects' packages: directory -> top-level package
SHIMS = {"horovod/_shim": "horovod", "ddp/_shim": "smdistributed.dataparallel"}
SHIMS_NEEDING_TF = {"data/_shims": "sagemaker_tensorflow"}
SITE_HOOKS = ("runtime/_site/sitecustomize.py", "tf/_hook/sitecustomize.py")
#: absent from a bare interpreter and only used inside functions: replaced by stand-ins
STUBBED = ("numpy", "psutil")
#: a module needing one of these, absent there, is skipped
FRAMEWORKS = ("tensorflow", "torch", "keras", "tf_keras", "mpi4py", "ray")

DRIVER = r"""
import importlib, json, runpy, sys, traceback, types
from unittest import mock

spec = json.loads(sys.argv[1])
out = {"syntax": [], "failed": [], "skipped": [], "imported": 0}


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return mock.MagicMock(name=self.__name__ + "." + name)


for name in spec["stubbed"]:
    try:
        importlib.import_module(name)
    except ImportError:
        sys.modules[name] = _Stub(name)

for path in spec["files"]:
    try:
        with open(path, encoding="utf-8") as fh:
            compile(fh.read(), path, "exec")
    except SyntaxError as exc:
        out["syntax"].append("%s:%s: %s" % (path, exc.lineno, exc.msg))


def attempt(label, load):
    try:
        load()
        out["imported"] += 1
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in spec["frameworks"]:
            out["skipped"].append("%s (needs %s)" % (label, top))
            return
        out["failed"].append(label + ": " + traceback.format_exc(limit=-3))
    except BaseException:
        out["failed"].append(label + ": " + traceback.format_exc(limit=-3))


for module in spec["modules"]:
    attempt(module, lambda: importlib.import_module(module))
for path in spec["hooks"]:
    attempt(path, lambda: runpy.run_path(path, run_name="sitecustomize"))
for directory, package in spec["shims"]:
    sys.path.insert(0, directory)
    attempt(package, lambda: importlib.import_module(package))
print(json.dumps(out))
"""


def _interpreters(version: str) -> list[str]:
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(
        glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}"))
    )
    on_path = shutil.which(f"python{version}")
    if not found and on_path:
        probe = subprocess.run([on_path, "-c", "pass"], capture_output=True, timeout=30)
        if probe.returncode == 0:  # a pyenv shim of an uninstalled version fails here
            found.append(on_path)
    return found[-1:]


def _in_job_files() -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for package in PACKAGES:
        files += sorted((SRC / "shipyard" / package).rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


def _module_name(path: pathlib.Path) -> str | None:
    rel = path.relative_to(SRC / "shipyard")
    if any(part in ("_shim", "_shims", "_site", "_hook") for part in rel.parts):
        return None
    parts = ["shipyard", *rel.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("version", ["3.7", "3.8"])
def test_in_job_packages_compile_and_import(version: str) -> None:
    pythons = _interpreters(version)
    if not pythons:
        pytest.skip(
            f"no Python {version} here (looked in ~/.pyenv/versions/{version}.*/bin "
            f"and for python{version} on PATH)"
        )
    files = _in_job_files()
    shims = [(str(SRC / "shipyard" / d), p) for d, p in SHIMS.items()]
    shims += [(str(SRC / "shipyard" / d), p) for d, p in SHIMS_NEEDING_TF.items()]
    spec = {
        "files": [str(f) for f in files],
        "modules": [m for m in map(_module_name, files) if m],
        "hooks": [str(SRC / "shipyard" / h) for h in SITE_HOOKS],
        "shims": shims,
        "stubbed": list(STUBBED),
        "frameworks": list(FRAMEWORKS),
    }
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(SRC),
        "PYTHONDONTWRITEBYTECODE": "1",  # no cpython-37 caches in the source tree
    }
    proc = subprocess.run(
        [pythons[0], "-s", "-c", DRIVER, json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["syntax"], f"Python {version} cannot compile:\n" + "\n".join(out["syntax"])
    assert not out["failed"], f"Python {version} cannot import:\n" + "\n".join(out["failed"])
    # the check must have checked something: most of the in-job modules need no framework
    assert out["imported"] >= len(spec["modules"]) // 2, out
