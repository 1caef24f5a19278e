"""shipyard.runtime.quickexit: an agent's exit without the interpreter's teardown (issue
40), with what an exit must still do."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import atexit, sys, threading
from shipyard.runtime.quickexit import exit_now

class Torn:
    def __del__(self):
        print("teardown", flush=True)

kept = Torn()  # a module global: deleted by the interpreter's teardown only
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("buffered, no newline")  # to a pipe: flushed by the exit, or lost
if sys.argv[1] == "thread":
    go = threading.Event()
    def work():
        go.wait(0.2)
        print(" thread done", flush=True)
    threading.Thread(target=work).start()
if sys.argv[2] == "quick":
    exit_now(3)
sys.exit(3)
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("how", ["quick", "ordinary"])
def test_the_exit_keeps_its_code_atexit_functions_and_buffered_output(how):
    done = _run("alone", how)
    assert done.returncode == 3, done.stderr
    assert "buffered, no newline" in done.stdout and "atexit ran" in done.stdout
    # the teardown is what the quick exit leaves out
    assert ("teardown" in done.stdout) == (how == "ordinary")


def test_a_working_thread_is_waited_for_as_by_the_ordinary_exit():
    done = _run("thread", "quick")
    assert done.returncode == 3, done.stderr
    assert "thread done" in done.stdout and "atexit ran" in done.stdout
