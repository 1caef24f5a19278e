"""One worker process: loads the model, then serves the shared listening socket.

A first worker answers /ping with 503 while loading (a replacement takes no connection
until it has loaded) and 500 with the reason if loading failed
(never 200), tells the master ``ready`` or ``failed <reason>`` on its report pipe, and
dies with the master (PR_SET_PDEATHSIG), so a killed endpoint leaves no orphans.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import socket
import sys

from shipyard import settings
from shipyard.serving.config import CONFIG_ENV, ServerConfig
from shipyard.serving.front_end import install_uvloop

log = logging.getLogger("shipyard.serving")


def die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the master's own cleanup still applies
        pass
    if os.getppid() == 1:
        sys.exit(0)


def limit_threads(n: int) -> None:
    """Framework threads per worker, set before any framework is imported."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(var, str(n))
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _after_load_threads(n: int) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", n)))


async def serve(
    config: ServerConfig, sock: socket.socket, report_fd: int, load_first: bool = False
) -> None:
    """Load the model and serve ``sock``. The first workers take connections at once
    (/ping answers 503 while they load); a replacement (``load_first``) takes none
    until its model is loaded: the socket is shared, and a request the kernel handed
    to a loading worker would fail while a ready one was free."""
    from shipyard.serving.app import App, State
    from shipyard.serving.batching import BatchingRunner, DirectRunner
    from shipyard.serving.errors import ShipyardError
    from shipyard.serving.front_end import FrontEnd
    from shipyard.serving.protocol import error_body
    from shipyard.serving.service import load_service

    state = State(config.max_payload_mb, config.execution_parameters())
    http = FrontEnd(App(state), state.max_payload, error_body)
    if not load_first:
        await http.start(sock, backlog=1024)  # /ping answers 503 while the model loads
    model_runner: DirectRunner = DirectRunner()
    if config.batch_size > 1:
        model_runner = BatchingRunner(config.batch_size, config.batch_wait_ms / 1000)
        model_runner.active = lambda: state.active

    def report(line: str) -> None:
        os.write(report_fd, (line.replace("\n", " ") + "\n").encode())

    loop = asyncio.get_running_loop()
    try:
        state.service = await loop.run_in_executor(
            None,
            load_service,
            config.model_dir,
            config.framework,
            model_runner,
            config.program,
            config.port,
        )
        _after_load_threads(config.threads_per_worker())
        report(f"ready {os.getpid()}")
    except ShipyardError as exc:
        state.failure = str(exc)
        report("failed " + json.dumps(state.failure))
    except Exception as exc:  # noqa: BLE001 - any load failure becomes the endpoint's reason
        state.failure = f"loading the model failed: {type(exc).__name__}: {exc}"
        report("failed " + json.dumps(state.failure))
    if load_first:  # loaded (or failed, and /ping says why): now take connections
        await http.start(sock, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await http.stop()


def main() -> None:
    die_with_parent()
    config = ServerConfig.from_json(settings.text(CONFIG_ENV))
    limit_threads(config.threads_per_worker())
    logging.basicConfig(level=logging.INFO, format=f"worker {os.getpid()}: %(message)s")
    sock = socket.socket(fileno=settings.integer("SHIPYARD_SERVING_FD"))
    report_fd = settings.integer("SHIPYARD_SERVING_REPORT_FD")
    install_uvloop()
    load_first = bool(settings.flag("SHIPYARD_SERVING_LOAD_FIRST"))
    asyncio.run(serve(config, sock, report_fd, load_first))


if __name__ == "__main__":
    main()
