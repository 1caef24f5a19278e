"""Entry point types, as the training toolkit runs them (_entry_point_type.py, process.py).

* a package (the code dir has setup.py/pyproject.toml): installed by staging, run as
  ``python -m <module>``;
* ``*.py``: ``python <script> <args>``;
* anything else (``*.sh``): ``/bin/sh -c "./<script> <args>"``. Unlike the toolkit the
  arguments are shell-quoted, so a hyperparameter with a space stays one argument.

The command is relative to the instance's code dir, which is its working directory.
"""

from __future__ import annotations

import os
import shlex
import sys

from shipyard.agent import mapping
from shipyard.agent.environment import module_name
from shipyard.jobplan.config import AgentConfig


def python_dir(agent_dir: str, python: str | None = None) -> str:
    """A directory whose ``python`` is the job's interpreter (this one, or the framework
    environment's), for PATH: a ``.sh`` entry point that calls ``python`` gets the job's
    Python, as in a SageMaker container. The interpreter's own directory when it has a
    ``python``, else a small wrapper in the instance's agent directory."""
    python = python or sys.executable
    here = os.path.dirname(python)
    candidate = os.path.join(here, "python")
    try:
        if os.path.samefile(candidate, python):
            return here
    except OSError:
        pass
    bin_dir = os.path.join(agent_dir, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    wrapper = os.path.join(bin_dir, "python")
    with open(wrapper + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
    os.chmod(wrapper + ".tmp", 0o755)
    os.replace(wrapper + ".tmp", wrapper)
    return bin_dir


def user_args(config: AgentConfig) -> list[str]:
    _, user_hps = mapping.split_hyperparameters(
        mapping.decode_hyperparameters(config.hyperparameters)
    )
    return mapping.to_cmd_args(user_hps)


def user_command(config: AgentConfig, code_dir: str, python: str | None = None) -> list[str]:
    """argv that runs the user's entry point with its hyperparameters (with the framework
    environment's interpreter when the job has one)."""
    python = python or config.python or sys.executable
    program = config.entry_point
    args = user_args(config)
    if config.python_package:
        return [python, "-m", str(module_name(program)).replace(os.sep, "."), *args]
    if program.endswith(".py"):
        return [python, program, *args]
    script = os.path.join(code_dir, program)
    if os.path.exists(script):
        os.chmod(script, os.stat(script).st_mode | 0o111)
    return ["/bin/sh", "-c", " ".join(["./" + shlex.quote(program), *map(shlex.quote, args)])]
