"""The failure text of an instance: what becomes the job's FailureReason.

SageMaker takes the first 1024 characters of /opt/ml/output/failure. A traceback's
useful part is at its end, so the exception line is put first and the tail of the
traceback after it; the whole stays within the limit.
"""

from __future__ import annotations

import os
import re
import signal

from shipyard.runtime import commandline

LIMIT = 1024
_TAIL_BYTES = 64 * 1024


def read_tail(path: str, nbytes: int = _TAIL_BYTES) -> str:
    """The end of an instance's log. The log lives in the job's records, out of the job's
    reach; O_NOFOLLOW all the same: a link there is never read through as root."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - nbytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def is_own_line(line: str) -> bool:
    """A line shipyard printed itself (``[shipyard]``, ``[shipyard-agent]``, ``[shipyard-tf]``...):
    never the user's error, whatever process of the instance printed it."""
    return line.startswith("[shipyard]") or line.startswith("[shipyard-")


def error_excerpt(output: str) -> tuple[str, str]:
    """(the exception line, the traceback) of the last Python traceback in ``output``.

    ``output`` is an instance's log: its other processes (parameter servers, relays, data
    feeders) may print after the failing one. So shipyard's own lines are dropped, and the
    exception line is the first unindented line after the traceback's frames (where Python
    puts it), not the log's last line; the excerpt ends with the exception's message.
    """
    lines = [ln for ln in output.splitlines() if not is_own_line(ln)]
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            start = i
            break
    if start is None:
        tail = [ln for ln in lines if ln.strip()][-5:]
        return (tail[-1].strip() if tail else ""), "\n".join(tail)
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "\t"))):
        end += 1  # the frames: indented
    if end >= len(lines):  # cut off before its exception line
        return "", "\n".join(lines[start:])
    exc_line = lines[end].strip()
    end += 1
    if exc_line.endswith(USER_CODE):
        return _user_code_error(exc_line, lines, start, end)
    if exc_line.endswith(GRAPH_ERROR):
        return _graph_error(exc_line, lines, start, end)
    while end < len(lines) and lines[end].startswith((" ", "\t")) and lines[end].strip():
        end += 1  # the message's continuation lines (TF errors indent them)
    return exc_line, "\n".join(lines[start:end])


USER_CODE = "in user code:"
# "    TypeError: ..." (or a bare "    KeyboardInterrupt"); not a code line such as
# "        raise ValueError(x)" of the user's frame
_INNER_ERROR = re.compile(r"^\s+([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::.*)?)$")


def _user_code_error(exc_line: str, lines: list[str], start: int, end: int) -> tuple[str, str]:
    """An autograph (tf.function) error: ``TypeError: in user code:``, a blank line, the
    user's frames indented, then the real exception, indented too, with its message. The
    block runs on through blank lines while lines stay indented; the real error is its last
    indented exception line (a Keras one can itself be "in user code:"), and the excerpt
    ends with that exception's message."""
    inner = None
    last = end
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "\t"))):
        match = _INNER_ERROR.match(lines[end])
        if match and not match.group(1).endswith(USER_CODE):
            inner = match.group(1).strip()
        if lines[end].strip():
            last = end + 1
        end += 1
    return (inner or exc_line), "\n".join(lines[start:last])


GRAPH_ERROR = "Graph execution error:"
# how far past the exception line TensorFlow's graph error may run (its node's frames)
_GRAPH_ERROR_SPAN = 400


def _graph_error(exc_line: str, lines: list[str], start: int, end: int) -> tuple[str, str]:
    """TensorFlow's ``InvalidArgumentError: Graph execution error:`` says its cause further
    down: a blank line, ``Detected at node ... defined at (most recent call last):``, the
    node's frames (indented, blank lines between), then the cause on an unindented line
    (``Received a label value of 10 which is outside the valid range of [0, 10).``) and the
    node line (``[[{{node ...}}]] [Op:...]``). The exception line gains the cause, and the
    excerpt runs to the node line, so the FailureReason says what went wrong. Without a node
    line in reach (the message was cut off) the excerpt stays as it was."""
    cause = None
    for j in range(end, min(len(lines), end + _GRAPH_ERROR_SPAN)):
        stripped = lines[j].strip()
        if stripped.startswith(("[[{{node", "[Op:")):
            if cause is None:
                return exc_line, "\n".join(lines[start:end])
            return f"{exc_line} {cause}", "\n".join(lines[start : j + 1])
        if (
            stripped
            and not lines[j].startswith((" ", "\t"))
            and not stripped.startswith("Detected at node")
        ):
            cause = stripped
    return exc_line, "\n".join(lines[start:end])


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
        f'Command "{commandline.shown(command)}"'
    )
    hint = api_hint(exc_line, traceback)
    if hint:
        head += f'\nHint "{hint}"'
    if len(head) >= LIMIT:
        return head[:LIMIT]
    room = LIMIT - len(head) - 1
    if traceback and room > 20:
        tb = traceback if len(traceback) <= room else "..." + traceback[-(room - 3) :]
        return head + "\n" + tb
    return head


_KERAS3 = "Keras 3 (TensorFlow 2.16+)"
_OLDER = (
    "; or run the script as written on a Keras 2 TensorFlow: ask for framework_version "
    "<= '2.15' (its environment is built for the job unless SHIPYARD_FRAMEWORK_ENVS=off)"
)
# (pattern in the exception line, pattern in the traceback or None, the API difference)
_API_HINTS: tuple[tuple[re.Pattern[str], re.Pattern[str] | None, str], ...] = (
    (
        re.compile(r"Argument\(s\) not recognized: \{'lr'"),
        None,
        f"{_KERAS3} optimizers take learning_rate=, not Keras 2's lr=",
    ),
    (
        re.compile(r"has no attribute 'reset_states'"),
        None,
        f"{_KERAS3} metrics have reset_state(), not Keras 2's reset_states()",
    ),
    (
        re.compile(r"'list' object is not callable"),
        re.compile(r"\.variables\(\)"),
        f"{_KERAS3}: optimizer.variables is a list, not Keras 2's method variables()",
    ),
    (
        re.compile(r"experimental_run_tf_function"),
        None,
        "compile(experimental_run_tf_function=...) is gone since TensorFlow 2.4's Keras: drop it",
    ),
)


def api_hint(exc_line: str, traceback: str) -> str | None:
    """The framework API difference behind a failure, when it is a known one (a TF 2.4-era
    Keras 2 script on Keras 3 fails with messages that do not say so)."""
    for line_pattern, tb_pattern, hint in _API_HINTS:
        if line_pattern.search(exc_line) and (tb_pattern is None or tb_pattern.search(traceback)):
            return hint + ("" if "experimental_run_tf_function" in hint else _OLDER)
    return None


def claim(path: str, text: str) -> bool:
    """Write ``text`` to the failure file at ``path`` unless someone already did (O_EXCL:
    among ranks or hosts failing together, the first writer's cause is the job's);
    returns whether this call wrote it."""
    try:  # O_EXCL with O_CREAT never follows a link at the name (it fails: EEXIST)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return True
