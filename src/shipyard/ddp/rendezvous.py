"""The rendezvous service on algo-1: ``python -m shipyard.ddp.rendezvous ...``.

What torchrun's agent does for its workers, as one small process:

1. host the job's TCPStore on the first free MASTER_PORT candidate of algo-1's address
   (every rank runs with ``TORCHELASTIC_USE_AGENT_STORE=True`` and connects to it);
2. tell each rank's wrapper which port that is (announce protocol, job-secret MACs);
3. watch the store: once the first rank has joined the process group, every other rank
   must join within ``--timeout`` seconds, or this service fails naming the missing
   ranks (its failure fails algo-1 and so the job, instead of a silent hang);
4. on SIGTERM (algo-1's own ranks are done) keep the store up until every rank of the
   job has reported its exit, at most ``--linger`` seconds (torchrun's exit barrier), so
   slower instances never lose the store under their feet.

The job secret arrives in the environment (SHIPYARD_DDP_SECRET), never on argv.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta

from shipyard import settings
from shipyard.ddp import contract
from shipyard.ddp.announce import AnnounceServer

SECRET_ENV = "SHIPYARD_DDP_SECRET"
WATCH_SECONDS = 0.25


def log(message: str) -> None:
    sys.stdout.write(f"[shipyard-ddp] {message}\n")
    sys.stdout.flush()


def listen_on(address: str, port: int) -> int:
    """A listening socket bound to ``address`` only (never a wildcard), as a bare fd.

    TCPStore binds every interface when it opens its own socket; handed this one
    (``master_listen_fd``) it serves only the instance's address."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(4096)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def open_store(address: str, ports: list[int], world_size: int):
    """A TCPStore server on the first port of ``ports`` that is free on ``address``,
    listening on that address only."""
    from torch.distributed import TCPStore

    errors = []
    for port in ports:
        try:
            fd = listen_on(address, port)
        except OSError as exc:  # address in use
            errors.append(f"{port}: {exc.strerror or exc}")
            continue
        try:
            store = TCPStore(
                address,
                port,
                world_size,
                is_master=True,
                timeout=timedelta(seconds=60),
                wait_for_workers=False,
                master_listen_fd=fd,
            )
            return store, port, errors
        except (RuntimeError, OSError) as exc:  # DistNetworkError
            os.close(fd)
            errors.append(f"{port}: {str(exc).splitlines()[0]}")
    raise SystemExit(
        _fail(f"no free MASTER_PORT on {address}: tried {ports} ({'; '.join(errors)})")
    )


_FAILURE_FILE: str | None = None


def _fail(text: str) -> int:
    """Record this service's failure text (ProcessSpec.failure_file) and return 1."""
    log(text)
    if _FAILURE_FILE:
        os.makedirs(os.path.dirname(_FAILURE_FILE), exist_ok=True)
        with open(_FAILURE_FILE, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 1


class Rendezvous:
    def __init__(self, args: argparse.Namespace, secret: str) -> None:
        self.args = args
        self.world = len(args.hosts) * args.nproc
        self.exited: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.store, self.port, skipped = open_store(args.addr, args.master_ports, self.world)
        if skipped:
            log(
                f"MASTER_PORT {args.master_ports[0]} is in use on {args.addr}; using "
                f"{self.port} (skipped {'; '.join(skipped)})"
            )
        self.announce = AnnounceServer(
            args.addr, args.announce_ports, secret, self.port, self.on_event
        ).start()
        log(
            f"store on {args.addr}:{self.port} for {self.world} ranks; announce port "
            f"{self.announce.port}"
        )

    def on_event(self, event: str, rank: int, code: int) -> None:
        if event == "exit":
            with self.lock:
                self.exited[rank] = code

    def watch(self) -> int:
        """Until stopped: fail if some ranks joined and others did not in time."""
        first_join: float | None = None
        joined: set[int] = set()
        while not self.stopping.wait(WATCH_SECONDS):
            if len(joined) == self.world:
                continue
            joined = contract.joined_ranks(self.store.list_keys())
            if joined and first_join is None:
                first_join = time.monotonic()
            if first_join is None or len(joined) == self.world:
                continue
            if time.monotonic() - first_join > self.args.timeout:
                missing = sorted(set(range(self.world)) - joined)
                return _fail(
                    contract.missing_ranks_message(
                        missing, len(joined), self.args.hosts, self.args.nproc, self.args.timeout
                    )
                )
        return 0

    def linger(self) -> None:
        """Keep the store up until every rank has reported its exit (or ``--linger``).

        Not after a rank failed: the job is going down, and waiting would only delay
        the instance's report of the failure."""
        deadline = time.monotonic() + self.args.linger
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.exited) >= self.world or any(self.exited.values()):
                    return
            time.sleep(0.05)
        with self.lock:
            left = sorted(set(range(self.world)) - set(self.exited))
        if left:
            log(f"stopping the store while ranks {left} had not reported their exit")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def ports(text: str) -> list[int]:
        return [int(p) for p in text.split(",") if p]

    parser = argparse.ArgumentParser(prog="python -m shipyard.ddp.rendezvous")
    parser.add_argument("--addr", required=True, help="algo-1's address (MASTER_ADDR)")
    parser.add_argument("--master-ports", type=ports, required=True)
    parser.add_argument("--announce-ports", type=ports, required=True)
    parser.add_argument("--hosts", type=lambda s: s.split(","), required=True)
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=contract.DEFAULT_RENDEZVOUS_TIMEOUT)
    parser.add_argument("--linger", type=float, default=4.0)
    parser.add_argument("--failure-file", default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global _FAILURE_FILE
    args = parse_args(argv)
    _FAILURE_FILE = args.failure_file
    rdzv = Rendezvous(args, settings.take(SECRET_ENV) or "")
    signal.signal(signal.SIGTERM, lambda *_: rdzv.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: rdzv.stopping.set())
    code = rdzv.watch()
    if code == 0:
        rdzv.linger()
    rdzv.announce.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
