"""``--help`` shows flags as flags: ``--quiet -q``, never ``--quiet -q <bool>`` (which reads
as a value to pass), on every command."""

from __future__ import annotations

import subprocess
import sys

import typer
from typer.testing import CliRunner

from shipyard.cli import app


def _paths(command, prefix=()):
    yield prefix
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _paths(sub, (*prefix, name))


def test_top_level_help_in_a_real_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    quiet = next(line for line in out.stdout.splitlines() if "--quiet" in line)
    assert "-q" in quiet and "<bool>" not in quiet and "no progress lines" in quiet
    assert "<bool>" not in out.stdout


def test_no_command_labels_a_flag_with_a_type() -> None:
    runner = CliRunner()
    paths = list(_paths(typer.main.get_command(app)))
    assert len(paths) > 10  # every command and subcommand walked
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], terminal_width=120)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, (path, result.output)
    train = runner.invoke(app, ["train", "--help"], terminal_width=120).output
    assert "<int>" in train  # options that take a value keep their type
    # a repeatable option names what to pass, not a Python type (issue 41)
    assert "<list[str]>" not in train and "NAME=VALUE" in train and "KEY=VALUE" in train


def test_arguments_are_named_in_capitals_and_never_typed_as_a_list() -> None:
    """``shipyard tensorboard JOBS`` read ``{jobs}... <list[str]>`` (issue 41); every
    command's positional arguments now read as gh's and kubectl's do."""
    runner = CliRunner()
    for path in _paths(typer.main.get_command(app)):
        output = runner.invoke(app, [*path, "--help"], terminal_width=120).output
        assert "<list[" not in output, (path, output)
        assert "{job}" not in output and "{jobs}" not in output, (path, output)
    board = runner.invoke(app, ["tensorboard", "--help"], terminal_width=120).output
    assert "{JOBS}..." in board and "JOBS" in board and "<str>" in board
    describe = runner.invoke(app, ["describe", "--help"], terminal_width=120).output
    assert "{JOB}" in describe
