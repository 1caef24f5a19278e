"""A relay names, for a relay of another instance, the local process behind an address.

Instances run in PID namespaces of their own, so a relay cannot find another instance's
processes in its /proc; it asks that instance's relay (SHIPYARD-WHO, with the job secret).
Real sockets and a real peer process here: the seam is the relay's own port."""

from __future__ import annotations

import socket
import subprocess
import sys

from shipyard.runtime.traffic import PeerNamer, Relay, TrafficBook, ask_who

PEER = (
    "import socket, sys\n"
    "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
    "print(s.getsockname()[1], flush=True)\n"
    "sys.stdin.read()\n"
)


def test_who_names_the_local_process_behind_an_address_for_the_right_secret():
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(8)
    relay = Relay(
        "ps:0",
        ("127.0.0.1", 0),
        target.getsockname(),
        TrafficBook(PeerNamer()),
        stats=lambda: {},
        secret="s3cret",
    )
    relay.start()
    assert relay.sock is not None
    address = relay.sock.getsockname()
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(target.getsockname()[1])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"SHIPYARD_PEER_LABEL": "chief:0", "PATH": "/usr/bin:/bin"},
    )
    try:
        port = int(peer.stdout.readline())
        assert ask_who(address, ("127.0.0.1", port), "s3cret") == "chief:0"
        assert ask_who(address, ("127.0.0.1", port), "wrong") is None
        assert ask_who(address, ("127.0.0.1", 1), "s3cret") is None  # nobody there
    finally:
        peer.kill()
        peer.wait()
        target.close()
        relay.sock.close()


def test_a_namer_asks_only_for_peers_it_cannot_find_here():
    asked = []

    def ask(peer):
        asked.append(peer)
        return "worker:1"

    namer = PeerNamer({"algo-2": "10.9.9.2"}, ask=ask)
    assert namer.name_all([("10.9.9.2", 40000)]) == {("10.9.9.2", 40000): "worker:1"}
    assert namer.name_all([("10.9.9.2", 40000)]) == {("10.9.9.2", 40000): "worker:1"}
    assert asked == [("10.9.9.2", 40000)]  # cached
    nobody = PeerNamer({"algo-2": "10.9.9.2"}, ask=lambda peer: None)
    assert nobody.name_all([("10.9.9.2", 1)]) == {("10.9.9.2", 1): "algo-2"}
