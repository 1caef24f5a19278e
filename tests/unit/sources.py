"""Parsed source files, once per test process: the house checks (floors, cycles, class
sizes, errors, settings reads, the HTTP layer) each walked every module of src/shipyard,
and parsing the ~360 files is ~1.5 s of CPU a time (issue 36). The trees are shared, so
a check must only read them."""

from __future__ import annotations

import ast
import functools
import os
import pathlib


def parsed(path: pathlib.Path | str) -> ast.Module:
    """The file's syntax tree (parsed again when the file changed since)."""
    path = pathlib.Path(path)
    stat = os.stat(path)
    return _parse(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2048)
def _parse(path: str, _mtime_ns: int, _size: int) -> ast.Module:
    return ast.parse(pathlib.Path(path).read_text(encoding="utf-8"), path)
