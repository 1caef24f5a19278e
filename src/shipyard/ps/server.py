"""The shard process: a ZeroMQ ROUTER loop around ``ServerCore``, and its CLI.

Why this is small: all protocol decisions live in core.py; this module only
moves frames, sends parameter buffers zero-copy (attaching ZeroMQ delivery
trackers so the shard knows when a buffer may be overwritten), runs the
heartbeat/checkpoint timers and handles shutdown. A shard never exits on bad
input; it exits on SIGTERM/SIGINT or a SHUTDOWN message, after a final
checkpoint, so a job never hangs on a parameter server that does not stop.

Run one shard::

    SHIPYARD_PS_SECRET=... python -m shipyard.ps.server \\
        --bind tcp://0.0.0.0:5555 --shard-index 0 --num-shards 2 \\
        --checkpoint-dir /opt/ml/checkpoints --consistency async

``--bind tcp://127.0.0.1:0`` picks a free port; the bound endpoint is printed
(``shipyard.ps.server: shard 0/2 listening on tcp://127.0.0.1:40123 pid 1234``)
and, with ``--ready-file PATH``, written there as JSON once the shard serves.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from . import wire
from .consistency import Consistency
from .core import DEFAULT_MAX_PAYLOAD, Outgoing, ServerConfig, ServerCore
from .errors import PSError
from .transport import ZERO_COPY_MIN, tune_malloc, tuned_socket

log = logging.getLogger("shipyard.ps.server")

TICK_S = 0.1  # liveness checks and stop-flag latency
SHARD_MALLOC_KEEP = 1 << 30  # a shard's memory is its parameters; keep message buffers for reuse


class PSServer:
    """Serve one shard on ``bind`` until ``stop()`` / SIGTERM / a SHUTDOWN message."""

    def __init__(
        self,
        config: ServerConfig,
        bind: str,
        secret: str | bytes | None = None,
        sndbuf: int = 4 << 20,
        rcvbuf: int = 4 << 20,
        exit_with_parent: bool = False,
        stats_file: str | None = None,
    ) -> None:
        import zmq

        self._zmq = zmq
        self.config = config
        # a shard whose launcher died must not live on (the "PS never exits" bug)
        self._parent = os.getppid() if exit_with_parent else None
        self.stats_file = stats_file
        tune_malloc(SHARD_MALLOC_KEEP)
        self.core = ServerCore(config, wire.secret_from_env(secret))
        self._ctx = zmq.Context()
        self._sock = s = tuned_socket(
            self._ctx, zmq.ROUTER, linger=2000, sndbuf=sndbuf, rcvbuf=rcvbuf
        )
        # a frame far above the limit disconnects its peer (ZeroMQ itself); one just
        # above it is read, authenticated and answered with an "oversized" error
        s.setsockopt(zmq.MAXMSGSIZE, 2 * config.max_payload + (1 << 20))
        s.bind(bind)
        self.endpoint: str = s.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask the loop to finish (safe from signal handlers and other threads)."""
        self._stop.set()

    def _send(self, out: Sequence[Outgoing]) -> None:
        zmq = self._zmq
        s = self._sock
        for o in out:
            s.send(o.peer, zmq.SNDMORE)
            last = len(o.frames) - 1
            for i, f in enumerate(o.frames):
                flags = zmq.SNDMORE if i < last else 0
                view = wire.as_bytes_view(f)
                if o.hold is not None and len(view) >= ZERO_COPY_MIN:
                    o.hold.tracker = s.send(view, flags, copy=False, track=True)
                else:
                    s.send(view, flags, copy=len(view) < ZERO_COPY_MIN)
            if o.hold is not None and o.hold.tracker is None:
                o.hold.released = True  # every frame was copied by ZeroMQ

    def serve(self) -> int:
        """The loop; returns the process exit code (0 on a clean stop)."""
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        core = self.core
        next_tick = time.monotonic() + TICK_S
        try:
            while not self._stop.is_set() and not core.shutdown_requested:
                timeout = max(0.0, next_tick - time.monotonic())
                if poller.poll(int(timeout * 1000) + 1):
                    # drain what is queued, then tick: bursts are served in order
                    for _ in range(256):
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        peer = frames[0].bytes
                        self._send(core.handle(peer, [f.buffer for f in frames[1:]]))
                        if core.shutdown_requested:
                            break
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK_S
                    if self._parent is not None and os.getppid() != self._parent:
                        log.warning(
                            "shard %d: launcher (pid %d) is gone; stopping",
                            self.config.index,
                            self._parent,
                        )
                        break
                    self._send(core.tick(now))
                    if core.checkpoint_due(now):
                        self._checkpoint()  # also refreshes the stats file
        finally:
            self._checkpoint(final=True)
            self._sock.close(linger=2000)
            self._ctx.term()
        return 0

    def _checkpoint(self, final: bool = False) -> None:
        try:
            path = self.core.checkpoint(force=final)
            if path is not None and final:
                log.info("shard %d: final checkpoint %s", self.config.index, path)
        except PSError as exc:
            log.error("shard %d: checkpoint failed: %s", self.config.index, exc)
        self.write_stats()

    def write_stats(self) -> None:
        """This shard's STATS JSON to ``stats_file`` (atomically), if one was given."""
        if not self.stats_file:
            return
        try:
            tmp = f"{self.stats_file}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.core.stats_json(), f, indent=1)
            os.replace(tmp, self.stats_file)
        except OSError as exc:
            log.error("shard %d: cannot write %s: %s", self.config.index, self.stats_file, exc)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shipyard.ps.server",
        description="Run one shipyard parameter-server shard (secret from $SHIPYARD_PS_SECRET).",
    )
    p.add_argument(
        "--bind", required=True, help="ZeroMQ endpoint, e.g. tcp://0.0.0.0:5555 (port 0: any)"
    )
    p.add_argument("--shard-index", type=int, required=True)
    p.add_argument("--num-shards", type=int, required=True)
    p.add_argument("--checkpoint-dir", default=None, help="resume from / write checkpoints here")
    p.add_argument(
        "--checkpoint-interval", type=float, default=60.0, help="seconds; 0 disables periodic"
    )
    p.add_argument("--consistency", default="async", help="async | bounded | sync")
    p.add_argument(
        "--max-staleness", type=int, default=None, help="bounded staleness s (implies bounded)"
    )
    p.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="sync: no round completes before this many workers have joined",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=10.0,
        help="seconds of silence after which a worker is considered dead",
    )
    p.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_PAYLOAD)
    p.add_argument(
        "--ready-file", default=None, help="write {endpoint, pid, shard} here once serving"
    )
    p.add_argument(
        "--stats-file",
        default=None,
        help="write this shard's stats JSON here at every checkpoint and at exit",
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop (after a final checkpoint) when the launching process exits",
    )
    p.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop once every one of --num-workers ranks has ended (DONE or lost)",
    )
    p.add_argument(
        "--join-timeout",
        type=float,
        default=600.0,
        help="with --exit-when-done: a rank not heard from this long after start is lost",
    )
    p.add_argument(
        "--failure-file",
        default=None,
        help="why this shard failed, for the agent: written at start (a kill leaves it), "
        "replaced by the reason on a failing exit, removed on success",
    )
    p.add_argument("--log-level", default=os.environ.get("SHIPYARD_PS_LOG_LEVEL", "INFO"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        config = ServerConfig(
            index=args.shard_index,
            num_shards=args.num_shards,
            consistency=Consistency.parse(args.consistency, args.max_staleness),
            heartbeat_timeout=args.heartbeat_timeout,
            expected_workers=args.num_workers,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_interval=args.checkpoint_interval,
            max_payload=args.max_message_bytes,
            exit_when_done=args.exit_when_done,
            join_timeout=args.join_timeout,
        )
        server = PSServer(
            config, args.bind, exit_with_parent=args.exit_with_parent, stats_file=args.stats_file
        )
    except PSError as exc:
        return _fail(args.failure_file, f"shipyard.ps.server: error: {exc}")
    except Exception as exc:  # noqa: BLE001 - e.g. the port is taken: say so in one line
        return _fail(
            args.failure_file, f"shipyard.ps.server: error: cannot serve on {args.bind}: {exc}"
        )
    where = args.checkpoint_dir or "nowhere (no --checkpoint-dir)"
    _write_text(
        args.failure_file,
        (
            f"parameter-server shard {args.shard_index} of {args.num_shards} ({server.endpoint}) ended "
            "unexpectedly (killed or crashed; its exit status is in the log); the workers cannot train "
            f"without it. Its last checkpoint is in {where}: run the job again with the same checkpoint "
            "location (checkpoint_local_path) to resume from it."
        ),
    )
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    print(
        f"shipyard.ps.server: shard {args.shard_index}/{args.num_shards} listening on "
        f"{server.endpoint} pid {os.getpid()}",
        flush=True,
    )
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(
                {
                    "endpoint": server.endpoint,
                    "pid": os.getpid(),
                    "shard": args.shard_index,
                    "resumed_from": server.core.resumed_from,
                },
                f,
            )
        os.replace(tmp, args.ready_file)
    server.serve()
    failure = server.core.failure_text()
    if failure:
        return _fail(
            args.failure_file, f"shipyard.ps.server: shard {args.shard_index}: {failure}", code=1
        )
    if args.failure_file and os.path.exists(args.failure_file):
        os.remove(args.failure_file)
    print(f"shipyard.ps.server: shard {args.shard_index} stopped", flush=True)
    return 0


def _write_text(path: str | None, text: str) -> None:
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)


def _fail(failure_file: str | None, text: str, code: int = 2) -> int:
    print(text, file=sys.stderr, flush=True)
    _write_text(failure_file, text)
    return code


if __name__ == "__main__":
    sys.exit(main())
