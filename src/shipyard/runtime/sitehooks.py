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
