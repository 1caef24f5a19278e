"""The ``shipyard`` command line: one typer app, one module per group of commands.

``app`` is the top group and the table of its commands (``app.COMMANDS``); each command's
module (``train``, ``jobs``, ``endpoints``, ``observe``, ``doctor``, ``server``, ``plan``)
is imported when that command runs (``lazy``). ``python -m shipyard.cli`` and the
``shipyard`` script both run ``main``.
"""

from shipyard.cli.app import app, main

__all__ = ["app", "main"]
