"""The ``shipyard`` command line: one typer app, one module per group of commands.

``app`` holds the job commands (train, jobs, describe, logs, stop) and registers the
others (``endpoints``); ``python -m shipyard.cli`` and the ``shipyard`` script both run
``main``.
"""

from shipyard.cli.app import app, main

__all__ = ["app", "main"]
