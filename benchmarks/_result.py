"""The one machine-readable line every benchmark ends with.

``RESULT <name> key=value ...``: the headline figures of the run, so BENCHMARKS.md can
say which line each table came from and a script can collect them.
"""

from __future__ import annotations


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace(" ", "_")


def result(name: str, **values: object) -> None:
    fields = " ".join(f"{key}={_text(value)}" for key, value in values.items())
    print(f"RESULT {name} {fields}", flush=True)
