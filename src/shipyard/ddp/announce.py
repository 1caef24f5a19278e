"""The announce protocol: how every rank learns the MASTER_PORT algo-1 picked.

One request, one reply, a JSON line each way over TCP. The rank's wrapper sends
``{"event", "rank", "code", "nonce", "mac"}``; the service answers
``{"master_port", "mac"}``. Both MACs are HMAC-SHA256 under the job's secret, so a
wrapper that reaches some other program on a candidate port (or another job's service)
sees a bad or missing reply and tries the next port, and the service ignores strangers.
Pure stdlib: the wrappers must not pay for importing torch.

Events: ``hello`` (where is the store?) and ``exit`` (this rank's process ended with
``code``; the service waits for every rank's exit before it stops the store).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import socketserver
import threading
from collections.abc import Callable

_MAX_LINE = 4096


def _mac(secret: str, *parts: object) -> str:
    message = "|".join(str(p) for p in parts).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def request(
    address: str, port: int, secret: str, event: str, rank: int, code: int = 0, timeout: float = 1.0
) -> int | None:
    """Ask one candidate port; the MASTER_PORT on success, None when it is not ours."""
    nonce = secrets.token_hex(8)
    payload = {
        "event": event,
        "rank": rank,
        "code": code,
        "nonce": nonce,
        "mac": _mac(secret, "c", nonce, event, rank, code),
    }
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(json.dumps(payload).encode() + b"\n")
            line = sock.makefile("rb").readline(_MAX_LINE)
        reply = json.loads(line)
        master_port = int(reply["master_port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not hmac.compare_digest(str(reply.get("mac", "")), _mac(secret, "s", nonce, master_port)):
        return None
    return master_port


class AnnounceServer:
    """Answers hello/exit requests with ``master_port``; calls ``on_event(event, rank, code)``."""

    def __init__(
        self,
        address: str,
        ports: list[int],
        secret: str,
        master_port: int,
        on_event: Callable[[str, int, int], None],
    ) -> None:
        self.secret = secret
        self.master_port = master_port
        self.on_event = on_event
        self.server = self._bind(address, ports)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, daemon=True, name="ddp-announce"
        )

    def _bind(self, address: str, ports: list[int]) -> socketserver.ThreadingTCPServer:
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 5

            def handle(self) -> None:
                outer._handle(self.rfile, self.wfile)

        socketserver.ThreadingTCPServer.daemon_threads = True
        last: OSError | None = None
        for port in ports:
            try:
                return socketserver.ThreadingTCPServer((address, port), Handler)
            except OSError as exc:  # taken: the next candidate
                last = exc
        raise OSError(f"no free announce port on {address} among {ports}: {last}")

    def _handle(self, rfile, wfile) -> None:
        try:
            msg = json.loads(rfile.readline(_MAX_LINE))
            event, rank, code, nonce = (
                msg["event"],
                int(msg["rank"]),
                int(msg["code"]),
                str(msg["nonce"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return
        if not hmac.compare_digest(
            str(msg.get("mac", "")), _mac(self.secret, "c", nonce, event, rank, code)
        ):
            return
        self.on_event(event, rank, code)
        reply = {
            "master_port": self.master_port,
            "mac": _mac(self.secret, "s", nonce, self.master_port),
        }
        wfile.write(json.dumps(reply).encode() + b"\n")

    def start(self) -> AnnounceServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
