"""The byte-counting relay with real sockets and a real client process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from shipyard.runtime.traffic import PeerNamer, Relay, TrafficBook, fetch_stats

CLIENT = r"""
import socket, sys, time
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
time.sleep(1.0)  # alive while the relay names it
payload = b"x" * int(sys.argv[2])
sock.sendall(payload)
sock.shutdown(socket.SHUT_WR)
got = 0
while True:
    chunk = sock.recv(65536)
    if not chunk:
        break
    got += len(chunk)
print(got)
"""


def echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                total = 0
                while True:
                    data = conn.recv(65536)
                    if not data:
                        break
                    total += len(data)
                conn.sendall(b"y" * (total // 2))  # answer half of what came in

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_relay_counts_bytes_per_named_peer():
    srv, upstream = echo_server()
    book = TrafficBook(PeerNamer({"algo-1": "127.0.0.1"}), interval=0.05)
    relay = Relay(
        "ps:0",
        ("127.0.0.1", 0),
        ("127.0.0.1", upstream),
        book,
        stats=lambda: book.to_json(),
        secret="sekrit",
    )
    relay.bind()
    port = relay.sock.getsockname()[1]
    relay.start()
    book.start_sampling()
    env = dict(os.environ, SHIPYARD_PEER_LABEL="worker:7")
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, str(port), "300000"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert int(out) == 150000
    stats = fetch_stats(("127.0.0.1", port), "sekrit")
    assert stats["relays"]["ps:0"] == {
        "worker:7": {"bytes_in": 300000, "bytes_out": 150000, "connections": 1}
    }
    book.sample()
    assert book.to_json()["timeline"]["points"][-1]["bytes"]["ps:0|worker:7"] == [300000, 150000]
    with pytest.raises(ConnectionError, match="wrong job secret"):
        fetch_stats(("127.0.0.1", port), "guess")
    srv.close()


def test_taken_port_fails_clearly():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    relay = Relay("ps:1", ("127.0.0.1", port), ("127.0.0.1", 1), TrafficBook(PeerNamer()))
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port} for ps:1"):
        relay.bind()
    taken.close()
