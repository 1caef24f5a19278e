"""The ``sitecustomize`` every job process loads, and the switches it reads.

Its directory (``_site``) goes on every job process's PYTHONPATH, sandboxed or not, right
after the code and dependency directories (shipyard/agent/environment.py). What it
installs:

* ``SHIPYARD_PYTHON_RESOLVER=1``: algo-k resolution in Python (shipyard/runtime/resolver.py),
  for plain-process instances only; a sandbox's libc resolves the names itself;
* always: the gloo exit guard, which stops a finished torch DDP rank from dying of
  SIGABRT while the interpreter finalizes (the docstring of ``_guard_gloo_exit``).
"""

from __future__ import annotations

import os

PYTHON_RESOLVER_ENV = "SHIPYARD_PYTHON_RESOLVER"


def site_dir() -> str:
    """Directory holding shipyard's job-process ``sitecustomize``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


def chain_after(hook_dir: str) -> None:
    """Run the next ``sitecustomize`` on sys.path after ``hook_dir`` (one of shipyard's
    hook directories), skipping it and shipyard's own job-process one: a user's own
    customization still runs, each of shipyard's hooks once (the TF hook chains to the
    DDP hook, which chains to the user's). Stdlib only: it runs inside jobs (3.7 on)."""
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.abspath(hook_dir)
    paths = [os.path.abspath(p or ".") for p in sys.path]
    after = len(paths) - paths[::-1].index(here) if here in paths else 0
    skip = (here, site_dir())
    others = [p for p in sys.path[after:] if os.path.abspath(p or ".") not in skip]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
