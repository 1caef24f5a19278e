"""A job process's command as its user wrote it, for the lines a user reads.

Every process of a sandboxed instance starts through the instance's launcher
(``<agent python> -I -S .../sandbox/launch.py [--bind SRC DST]... -- PROGRAM ARGS``, or the
compiled ``.../shipyard-launch-<version> [--bind SRC DST]... -- PROGRAM ARGS``), and a
framework environment's interpreter is a long path; SageMaker's log and FailureReason show
``python train.py --epochs 1``. This module gives that form back: the launcher's part goes
(everything up to its ``--``), and an interpreter path is named by its file name. The full
command stays where it is needed: the processes themselves (``ps``) and the code that starts
them.
"""

from __future__ import annotations

import os
import re
import shlex

_LAUNCHER = os.path.join("sandbox", "launch.py")
_COMPILED_LAUNCHER = "shipyard-launch-"  # shipyard.sandbox.launchbin.PREFIX
_INTERPRETER = re.compile(r"^python(\d+(\.\d+)?)?$")


def as_written(argv: list[str]) -> list[str]:
    """``argv`` without the launcher, its interpreter as ``python`` (or ``python3.7``)."""
    words = list(argv)
    launched = any(w.endswith(_LAUNCHER) for w in words[:4]) or (
        bool(words) and os.path.basename(words[0]).startswith(_COMPILED_LAUNCHER)
    )
    if launched and "--" in words:
        words = words[words.index("--") + 1 :]
    if words and os.sep in words[0] and _INTERPRETER.match(os.path.basename(words[0])):
        words[0] = os.path.basename(words[0])
    return words


def shown(argv: list[str]) -> str:
    """:func:`as_written`, quoted as a shell would need it (``shlex.join`` is 3.8+: this
    module also runs in a framework environment's Python 3.7)."""
    return " ".join(shlex.quote(word) for word in as_written(argv))
