"""Where the commands print: one module below app.py and its command groups, so that
``cli/endpoints.py`` and ``cli/observe.py`` share it without importing ``cli/app.py``
(which imports them to register their commands: a cycle)."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

#: the exit codes every command shares (app.py's docstring says what each means)
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_INTERRUPTED = 1, 2, 3, 130


def out_console() -> Console:
    """stdout; when it is not a terminal, wide enough that tables keep whole job names
    and paths (rich would otherwise fold them to 80 columns)."""
    plain = Console()
    return plain if plain.is_terminal else Console(width=1000, highlight=False)


def fail(message: str, code: int) -> NoReturn:
    """``error: message`` on stderr, then exit with ``code``. The message is printed as
    text: a value in it (a job name, ``pip install 'shipyard[tensorflow]'``) is never
    read as rich markup."""
    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)
