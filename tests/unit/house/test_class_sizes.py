"""Responsibilities, not line counts, decide a class's shape; but a class past 400 lines has
always turned out to hold more than one (issue 26: the ps client, the collective engine, the
job supervisor, the S3 front end), so the house stops one from growing back."""

from __future__ import annotations

import ast
import pathlib

from tests.unit.sources import parsed

SRC = pathlib.Path(__file__).resolve().parents[3] / "src" / "shipyard"
LIMIT = 400


def _classes():
    for path in sorted(SRC.rglob("*.py")):
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(SRC.parent), node


def test_no_class_is_over_400_lines():
    big = [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, node in _classes()
        if node.end_lineno - node.lineno + 1 > LIMIT
    ]
    assert big == [], "split these by responsibility:\n" + "\n".join(big)
