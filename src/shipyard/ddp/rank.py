"""One rank's wrapper: ``python -m shipyard.ddp.rank [options] -- <user command>``.

Why a wrapper at all: the MASTER_PORT is only known once algo-1's rendezvous service
has bound it, and a failing rank must say which rank it was. The wrapper

1. asks the service for the MASTER_PORT (announce protocol; retried until the service
   is up, at most ``--timeout`` seconds, default contract.DISCOVERY_TIMEOUT);
2. runs the user's command with the torchrun environment, relaying its output line by
   line (so ranks sharing one instance log never split each other's lines) and keeping
   the tail;
3. when the rank fails, writes the failure text (rank named, SageMaker's
   ExecuteUserScriptError format) to the instance's failure file; the first rank to
   fail on an instance wins (O_EXCL), and a rank that only died because a peer vanished
   waits a moment first so the rank that really failed is reported as the root cause;
4. reports the rank's exit to the service (its exit barrier).

Pure stdlib: importing torch here would double every rank's start-up time and memory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from shipyard import settings
from shipyard.ddp import announce, contract
from shipyard.runtime import failure
from shipyard.runtime.lifeline import die_with_parent

SECRET_ENV = "SHIPYARD_DDP_SECRET"
_TAIL = 64 * 1024
# Output of a rank that failed only because another rank went away first.
PEER_LOSS_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "ECONNRESET",
    "NCCL communicator was aborted",
    "Socket Timeout",
    "recvBytes",
    "DistNetworkError",
)
PEER_LOSS_DELAY = 1.5


def discover(
    address: str, ports: list[int], secret: str, rank: int, timeout: float
) -> tuple[int, int]:
    """(MASTER_PORT algo-1's service chose, the announce port that answered), asked until
    the service answers or time runs out."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        for port in ports:
            found = announce.request(address, port, secret, "hello", rank, timeout=1.0)
            if found is not None:
                return found, port
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"rank {rank} could not reach the rendezvous service on {address} (ports "
                f"{ports[0]}-{ports[-1]}) within {timeout:g}s: algo-1 never started it"
            )
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def relay(proc: subprocess.Popen) -> bytes:
    """Copy the child's output to ours, whole lines at a time; return the last 64 KiB."""
    out = sys.stdout.buffer
    tail = bytearray()
    pending = b""
    assert proc.stdout is not None  # started with stdout=PIPE
    fd = proc.stdout.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        if not chunk:
            break
        tail += chunk
        del tail[:-_TAIL]
        pending += chunk
        cut = pending.rfind(b"\n") + 1
        if cut or len(pending) > _TAIL:
            cut = cut or len(pending)
            out.write(pending[:cut])
            out.flush()
            pending = pending[cut:]
    if pending:
        out.write(pending)
        out.flush()
    return bytes(tail)


def elastic_error(path: str | None) -> str | None:
    """The message a script decorated with torch's ``@record`` left in its error file."""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        message = data["message"]
        return message["message"] if isinstance(message, dict) else str(message)
    except (OSError, ValueError, KeyError, TypeError):
        return None


# What torch says when a process group asks for NCCL where there is none: a CPU-only torch
# build, or a CUDA build on a machine without GPUs.
NCCL_UNUSABLE_MARKERS = (
    "doesn't have NCCL built in",
    "ProcessGroupNCCL is only supported with GPUs",
)


def nccl_hint(output: str, num_gpus: str | None) -> str | None:
    """Why NCCL failed, in the user's terms, when the instance has no GPU."""
    if num_gpus not in (None, "", "0") or not any(m in output for m in NCCL_UNUSABLE_MARKERS):
        return None
    return (
        "backend 'nccl' needs a GPU and this instance has no GPU (SM_NUM_GPUS=0): use "
        "backend='gloo' on CPU instances, e.g. init_process_group(backend='nccl' if "
        "torch.cuda.is_available() else 'gloo'), or an instance type with GPUs"
    )


def failure_text(
    who: str, code: int, command: list[str], output: str, error_file: str | None
) -> str:
    text = failure.failure_text(code, command, output)
    recorded = elastic_error(error_file)
    if recorded and recorded not in text:
        text = text.replace('ErrorMessage "', f'ErrorMessage "{recorded.strip()} | ', 1)
    hint = nccl_hint(output, os.environ.get("SM_NUM_GPUS"))
    if hint:
        text = text.replace('ErrorMessage "', f'ErrorMessage "{hint} | ', 1)
    return f"{who} failed: {text}"[: failure.LIMIT]


def write_once(path: str, text: str) -> None:
    """Write the instance's failure file unless an earlier rank already did."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    failure.claim(path, text)


def exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def run(args: argparse.Namespace, command: list[str]) -> int:
    secret = settings.take(SECRET_ENV) or ""
    rank = int(os.environ["RANK"])
    hosts = args.hosts.split(",")
    who = contract.describe_rank(rank, hosts, int(os.environ["LOCAL_WORLD_SIZE"]))
    try:
        port, service = discover(
            args.announce_addr, args.announce_ports, secret, rank, args.timeout
        )
    except TimeoutError as exc:
        write_once(args.failure_file, f"{who} failed: {exc}")
        return 1
    env = dict(os.environ, MASTER_PORT=str(port))
    proc = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        close_fds=True,
        preexec_fn=die_with_parent,
    )  # noqa: PLW1509 - no threads here

    def forward(signum: int, _frame) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    output = relay(proc).decode("utf-8", "replace")
    code = proc.wait()
    if code != 0:
        if any(marker in output for marker in PEER_LOSS_MARKERS):
            time.sleep(PEER_LOSS_DELAY)  # let the rank that failed first be the root cause
        write_once(
            args.failure_file,
            failure_text(who, code, command, output, os.environ.get("TORCHELASTIC_ERROR_FILE")),
        )
    announce.request(args.announce_addr, service, secret, "exit", rank, code, timeout=1.0)
    return exit_status(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("usage: python -m shipyard.ddp.rank [options] -- command ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m shipyard.ddp.rank")
    parser.add_argument("--announce-addr", required=True)
    parser.add_argument(
        "--announce-ports", required=True, type=lambda s: [int(p) for p in s.split(",") if p]
    )
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--failure-file", required=True)
    parser.add_argument(
        "--timeout",
        type=float,
        default=contract.DISCOVERY_TIMEOUT,
        help="seconds to wait for the rendezvous service to answer",
    )
    args = parser.parse_args(argv[:split])
    return run(args, argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
