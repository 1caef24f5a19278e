"""The command a user reads (the agent's 'starting' line, the FailureReason's Command) is the
one they wrote: no launcher, the interpreter as ``python`` (issue 41: the line was the
sandbox wrapper, about 300 characters)."""

from __future__ import annotations

from shipyard.runtime.commandline import as_written, shown
from shipyard.runtime.failure import failure_text

LAUNCHED = [
    "/work/.venv/bin/python",
    "-I",
    "-S",
    "/work/src/shipyard/sandbox/launch.py",
    "--bind",
    "/a",
    "/b",
    "--",
    "/home/u/.shipyard/environments/tensorflow-2.4.1/bin/python",
    "train.py",
    "--epochs",
    "1",
]


def test_the_launcher_and_the_interpreter_path_go():
    assert as_written(LAUNCHED) == ["python", "train.py", "--epochs", "1"]
    assert shown([*LAUNCHED[:-2], "--name", "a b"]) == "python train.py --name 'a b'"


def test_the_compiled_launcher_goes_too():
    """Issue 40: the launcher runs compiled where it can be built (sandbox/launchbin)."""
    compiled = ["/root/.cache/shipyard/shipyard-launch-0badcafe-9000", *LAUNCHED[4:]]
    assert as_written(compiled) == ["python", "train.py", "--epochs", "1"]


def test_a_command_without_the_launcher_keeps_its_words():
    assert as_written(["mpirun", "-np", "2", "python", "t.py"]) == [
        "mpirun",
        "-np",
        "2",
        "python",
        "t.py",
    ]
    assert as_written(["/opt/env/bin/python3.7", "t.py"]) == ["python3.7", "t.py"]
    assert as_written(["/usr/bin/bash", "run.sh"]) == ["/usr/bin/bash", "run.sh"]  # not a Python


def test_the_failure_reason_shows_the_users_command():
    text = failure_text(1, LAUNCHED, "Traceback (most recent call last):\n  x\nValueError: no")
    assert 'Command "python train.py --epochs 1"' in text
    assert "launch.py" not in text
