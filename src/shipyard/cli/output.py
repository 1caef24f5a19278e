"""Where the commands print: one module below app.py and its command groups, so that
``cli/endpoints.py`` and ``cli/observe.py`` share it without importing ``cli/app.py``
(which imports them to register their commands: a cycle)."""

from __future__ import annotations

from rich.console import Console


def out_console() -> Console:
    """stdout; when it is not a terminal, wide enough that tables keep whole job names
    and paths (rich would otherwise fold them to 80 columns)."""
    plain = Console()
    return plain if plain.is_terminal else Console(width=1000, highlight=False)
