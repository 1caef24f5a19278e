"""The shard process: a socket loop around ``ServerCore``, and its CLI.

Why this is small: all protocol decisions live in core.py; this module only
moves frames (stream.py's framing over non-blocking TCP connections, every peer
served from one selector, so a slow or stuck peer never holds another), sends
parameter buffers zero-copy (a reply's ``Hold`` is done once its last byte is in
the kernel, so the shard knows when a buffer may be overwritten), runs the
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
import itertools
import json
import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Sequence

from shipyard import settings

from . import wire
from .consistency import Consistency
from .core import DEFAULT_MAX_PAYLOAD, Outgoing, ServerConfig, ServerCore
from .errors import ErrorCode, PSError
from .stream import (
    DEFAULT_MAX_FRAMES,
    FramingError,
    PeerClosed,
    Reader,
    Sent,
    Writer,
    close_watched,
    parse_endpoint,
    tune_socket,
)
from .transport import tune_malloc
from .wire import Buffer

log = logging.getLogger("shipyard.ps.server")

TICK_S = 0.1  # liveness checks and stop-flag latency
SHARD_MALLOC_KEEP = 1 << 30  # a shard's memory is its parameters; keep message buffers for reuse
FRAME_TIMEOUT_S = 30.0  # a peer silent this long in the middle of a message is dropped
LINGER_S = 2.0  # at exit, how long queued replies (SHUTDOWN, DONE answers) may take to leave


class _Peer:
    """One client connection."""

    __slots__ = ("id", "sock", "reader", "writer", "writing")

    def __init__(self, peer_id: bytes, sock: socket.socket, max_bytes: int) -> None:
        self.id = peer_id
        self.sock = sock
        self.reader = Reader(sock, max_bytes, DEFAULT_MAX_FRAMES)
        self.writer = Writer(sock)
        self.writing = False


class PSServer:
    """Serve one shard on ``bind`` until ``stop()`` / SIGTERM / a SHUTDOWN message."""

    def __init__(
        self,
        config: ServerConfig,
        bind: str,
        secret: str | bytes | None = None,
        exit_with_parent: bool = False,
        stats_file: str | None = None,
        frame_timeout: float = FRAME_TIMEOUT_S,
    ) -> None:
        self.config = config
        # a shard whose launcher died must not live on (the "PS never exits" bug)
        self._parent = os.getppid() if exit_with_parent else None
        self.stats_file = stats_file
        self.frame_timeout = frame_timeout
        tune_malloc(SHARD_MALLOC_KEEP)
        self.core = ServerCore(config, wire.secret_from_env(secret))
        host, port = parse_endpoint(bind)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = ls = socket.socket(family, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            ls.bind((host, port))
            ls.listen(128)
        except OSError:
            ls.close()
            raise
        ls.setblocking(False)
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.endpoint: str = f"tcp://{shown}:{ls.getsockname()[1]}"
        # a message far above the limit drops its connection before it is read; one
        # just above it is read, authenticated and answered with an "oversized" error
        self._max_bytes = 2 * config.max_payload + (1 << 20)
        self._ep = select.epoll()  # epoll itself: the selectors wrapper costs ~5 us a call
        self._ep.register(ls.fileno(), select.EPOLLIN)
        self._by_fd: dict[int, _Peer] = {}
        self._peers: dict[bytes, _Peer] = {}
        self._ids = itertools.count(1)
        self._stopping = False  # set by stop(); a plain attribute: no call per wake-up

    def stop(self) -> None:
        """Ask the loop to finish (safe from signal handlers and other threads)."""
        self._stopping = True

    # connections -------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: keep serving the others
                log.warning("shard %d: accept failed: %s", self.config.index, exc)
                return
            tune_socket(sock)
            peer = _Peer(b"%d" % next(self._ids), sock, self._max_bytes)
            self._peers[peer.id] = peer
            self._by_fd[sock.fileno()] = peer
            self._ep.register(sock.fileno(), select.EPOLLIN)

    def _drop(self, peer: _Peer, why: str) -> None:
        log.debug("shard %d: dropping connection %s: %s", self.config.index, peer.id, why)
        self._peers.pop(peer.id, None)
        peer.writer.drop()  # its holds are released: nothing will read those buffers
        self._by_fd.pop(close_watched(self._ep, peer.sock), None)

    def _flush(
        self, peer: _Peer, frames: Sequence[Buffer] | None = None, sent: Sent | None = None
    ) -> None:
        """Write what the kernel takes (after queueing ``frames``, if given); watch for
        write readiness only while something is left."""
        try:
            done = peer.writer.flush() if frames is None else peer.writer.send(frames, sent)
        except PeerClosed as exc:
            self._drop(peer, str(exc))
            return
        if done == peer.writing:
            peer.writing = not done
            events = select.EPOLLIN | (select.EPOLLOUT if peer.writing else 0)
            self._ep.modify(peer.sock.fileno(), events)

    def _send(self, out: Sequence[Outgoing]) -> None:
        for o in out:
            peer = self._peers.get(o.peer)
            if peer is None:  # that connection is gone: dropped, as ROUTER did
                if o.hold is not None:
                    o.hold.released = True
                continue
            sent = None
            if o.hold is not None:
                sent = o.hold.tracker = Sent()
            self._flush(peer, o.frames, sent)

    def _read(self, peer: _Peer) -> None:
        core = self.core
        try:
            messages = peer.reader.read()
        except PeerClosed as exc:
            self._drop(peer, str(exc))
            return
        except FramingError as exc:
            core.stats.reject(exc.code)
            log.info("shard %d: %s; connection dropped", self.config.index, exc)
            self._drop(peer, str(exc))
            return
        for frames in messages:
            self._send(core.handle(peer.id, frames))
            if core.shutdown_requested:
                return

    def _expire_partial(self, now: float) -> None:
        """Drop peers that stopped in the middle of a message (they hold a buffer and
        would otherwise keep it forever); the others were never waiting on them."""
        for peer in list(self._peers.values()):
            since = peer.reader.partial_since
            if since is not None and now - since > self.frame_timeout:
                self.core.stats.reject(ErrorCode.FRAME_TIMEOUT)
                log.info(
                    "shard %d: connection %s stopped mid-message for %.0fs; dropped",
                    self.config.index,
                    peer.id.decode(),
                    now - since,
                )
                self._drop(peer, "mid-message timeout")

    # the loop ----------------------------------------------------------------------
    def serve(self) -> int:
        """The loop; returns the process exit code (0 on a clean stop)."""
        core = self.core
        next_tick = time.monotonic() + TICK_S
        listener, by_fd, poll = self._listener.fileno(), self._by_fd, self._ep.poll
        try:
            while not self._stopping and not core.shutdown_requested:
                timeout = max(0.0, next_tick - time.monotonic())
                for fd, events in poll(timeout):
                    if fd == listener:
                        self._accept()
                        continue
                    peer = by_fd.get(fd)
                    if peer is None:
                        continue
                    if events & select.EPOLLOUT:
                        self._flush(peer)
                    if events & ~select.EPOLLOUT and peer.id in self._peers:
                        self._read(peer)
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
                    self._expire_partial(now)
                    if core.checkpoint_due(now):
                        self._checkpoint()  # also refreshes the stats file
        finally:
            self._checkpoint(final=True)
            self._linger(LINGER_S)
            self._close()
        return 0

    def _linger(self, seconds: float) -> None:
        """Let queued replies (the SHUTDOWN answer, held DONE answers) leave."""
        deadline = time.monotonic() + seconds
        while any(p.writer.pending for p in self._peers.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for fd, events in self._ep.poll(min(left, 0.1)):
                peer = self._by_fd.get(fd)
                if peer is not None and events & select.EPOLLOUT:
                    self._flush(peer)

    def _close(self) -> None:
        for peer in list(self._peers.values()):
            self._drop(peer, "shard stopping")
        self._ep.close()
        self._listener.close()

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
        "--bind", required=True, help="tcp://HOST:PORT, e.g. tcp://0.0.0.0:5555 (port 0: any)"
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
        "--frame-timeout",
        type=float,
        default=FRAME_TIMEOUT_S,
        help="seconds a peer may stay silent in the middle of a message before it is dropped",
    )
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
    p.add_argument("--log-level", default=settings.text("SHIPYARD_PS_LOG_LEVEL"))
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
            config,
            args.bind,
            exit_with_parent=args.exit_with_parent,
            stats_file=args.stats_file,
            frame_timeout=args.frame_timeout,
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
