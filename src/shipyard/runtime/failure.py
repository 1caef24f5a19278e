"""The failure text of an instance: what becomes the job's FailureReason.

SageMaker takes the first 1024 characters of /opt/ml/output/failure. A traceback's
useful part is at its end, so the exception line is put first and the tail of the
traceback after it; the whole stays within the limit.
"""

from __future__ import annotations

import os
import shlex
import signal

LIMIT = 1024
_TAIL_BYTES = 64 * 1024


def read_tail(path: str, nbytes: int = _TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - nbytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def error_excerpt(output: str) -> tuple[str, str]:
    """(the exception line, the traceback tail) found in a process's output."""
    lines = [ln for ln in output.splitlines() if not ln.startswith("[shipyard-agent]")]
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            start = i
            break
    if start is None:
        tail = [ln for ln in lines if ln.strip()][-5:]
        return (tail[-1].strip() if tail else ""), "\n".join(tail)
    block = lines[start:]
    # The exception line: the last non-indented line of the traceback block.
    exc_line = ""
    for line in reversed(block):
        if line.strip() and not line.startswith((" ", "\t")):
            exc_line = line.strip()
            break
    return exc_line, "\n".join(block)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"{code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def failure_text(exit_code: int, command: list[str], output: str) -> str:
    """The toolkit's ExecuteUserScriptError message, exception first, within 1024 chars."""
    exc_line, traceback = error_excerpt(output)
    head = (
        "AlgorithmError: ExecuteUserScriptError:\n"
        f"ExitCode {describe_exit(exit_code)}\n"
        f'ErrorMessage "{exc_line}"\n'
        f'Command "{shlex.join(command)}"'
    )
    if len(head) >= LIMIT:
        return head[:LIMIT]
    room = LIMIT - len(head) - 1
    if traceback and room > 20:
        tb = traceback if len(traceback) <= room else "..." + traceback[-(room - 3) :]
        return head + "\n" + tb
    return head


def claim(path: str, text: str) -> bool:
    """Write ``text`` to the failure file at ``path`` unless someone already did (O_EXCL:
    among ranks or hosts failing together, the first writer's cause is the job's);
    returns whether this call wrote it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return True
