"""What crosses the wire: byte-counting TCP relays in front of a job's servers.

Framework-agnostic on purpose (TensorFlow's parameter servers use it; shipyard.ps and
mpi can too). A :class:`Relay` listens on a server's public address (an instance's own
IP and a well-known port) and forwards every connection to the server's private port,
counting the bytes of each direction for each connection. The peer of a connection is
named by the process that opened it -- its ``SHIPYARD_PEER_LABEL`` environment variable
(``chief:0``, ``worker:1``), found through the kernel's socket table -- because on one
machine every client connects from 127.0.0.1, so the source IP alone names no one. A
peer in another instance's sandbox (its own PID namespace: its processes are not in this
one's ``/proc``) is named by a relay of that instance, asked ``SHIPYARD-WHO`` with the
job secret (``ask``). Peers on other machines are named by their instance's IP.

Counts are real bytes of TCP payload (gRPC/HTTP2 framing included), exact, sampled over
time, and served to the job's coordinator through the relay's own port: a connection
whose first bytes are ``SHIPYARD-STATS <job secret>\\n`` gets the counters as JSON
instead of being relayed (:func:`fetch_stats`).
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"SHIPYARD-STATS "
WHO = b"SHIPYARD-WHO "  # + secret, ip, port: the label of the local process at that address
LABEL_ENV = "SHIPYARD_PEER_LABEL"
_BUFFER = 256 * 1024
MAX_POINTS = 600
UPSTREAM_GONE_S = 0.5


class PeerNamer:
    """Names the process behind a connection's remote end (cached per address)."""

    def __init__(
        self,
        addresses: Mapping[str, str] | None = None,
        ask: Callable[[tuple[str, int]], str | None] | None = None,
    ) -> None:
        self.host_by_ip = {ip: host for host, ip in (addresses or {}).items()}
        self.ask = ask  # names a peer that lives in another instance (see the module doc)
        self._cache: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def find_local(self, peers: list[tuple[str, int]]) -> None:
        """Name the ``peers`` whose processes are on this instance (misses are not kept:
        ``name_all`` tries again, and asks)."""
        with self._lock:
            owners = self._local_owners({p for p in peers if p not in self._cache})
            for peer, pid in owners.items():
                self._cache[peer] = self._label_of(pid)

    def name_all(self, peers: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """Names for ``peers``; one scan of the socket table for all the unknown ones."""
        with self._lock:
            todo = [p for p in peers if p not in self._cache]
            if todo:
                owners = self._local_owners(set(todo))
                for peer in todo:
                    pid = owners.get(peer)
                    label = self._label_of(pid) if pid is not None else None
                    if label is None and self.ask is not None:
                        label = self.ask(peer)
                    self._cache[peer] = label or self.host_by_ip.get(peer[0], peer[0])
            return {p: self._cache[p] for p in peers}

    @staticmethod
    def _local_owners(peers: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        import psutil

        try:
            conns = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return {}
        owners = {}
        for c in conns:  # gRPC's sockets are dual-stack: ::ffff:127.0.0.1 is 127.0.0.1
            if c.pid is not None and c.laddr:
                local = (_ipv4(c.laddr.ip), c.laddr.port)
                if local in peers:
                    owners[local] = c.pid
        missing = peers - set(owners)
        if missing:  # peers in other instances' sandboxes: other network namespaces
            owners.update(_owners_in_other_namespaces(missing))
        return owners

    @staticmethod
    def _label_of(pid: int) -> str:
        import psutil

        try:
            env = psutil.Process(pid).environ()
        except (psutil.Error, OSError):
            return f"pid:{pid}"
        label = env.get(LABEL_ENV)
        if label:
            return label
        return f"{env.get('SHIPYARD_CURRENT_HOST', '?')}/pid:{pid}"


def _ipv4(ip: str) -> str:
    return ip[7:] if ip.startswith("::ffff:") else ip  # str.removeprefix: 3.9+


def _hex_address(text: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host byte order)."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return _ipv4(socket.inet_ntop(socket.AF_INET6, words))


def _socket_inodes(pid: int, peers: set[tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """socket inode -> local (ip, port), for ``peers`` in the network namespace of ``pid``."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            ip, _, port = fields[1].partition(":")
            local = (_hex_address(ip), int(port, 16))
            if local in peers:
                found[fields[9]] = local
    return found


def _owners_in_other_namespaces(peers: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Owners of ``peers`` that live in other network namespaces (instance sandboxes: each
    instance has its own, and this process sees only its own in psutil's table). One
    process per namespace gives that namespace's socket table; its sockets' owners are
    found among the namespace's processes by their fds."""
    mine = _netns("self")
    by_ns: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ns = _netns(entry)
            if ns is not None and ns != mine:
                by_ns.setdefault(ns, []).append(int(entry))
    owners: dict[tuple[str, int], int] = {}
    for pids in by_ns.values():
        inodes = _socket_inodes(pids[0], peers - set(owners))
        if not inodes:
            continue
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    owners.setdefault(inodes[link[8:-1]], pid)
        if len(owners) == len(peers):
            break
    return owners


def _netns(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


@dataclass
class Link:
    """One relayed connection and its byte counts (client -> server is ``bytes_in``)."""

    relay: str
    peer: tuple[str, int]
    opened: float = field(default_factory=time.time)
    bytes_in: int = 0
    bytes_out: int = 0
    closed: float | None = None


class TrafficBook:
    """Every link of the relays of one process, their peers' names and a timeline."""

    def __init__(self, namer: PeerNamer, interval: float = 1.0) -> None:
        self.namer = namer
        self.links: list[Link] = []
        self.started = time.time()
        self.interval = interval
        self.points: list[tuple[float, dict[str, list[int]]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def add(self, link: Link) -> None:
        with self._lock:
            self.links.append(link)

    def totals(self) -> dict[str, dict[str, dict[str, int]]]:
        """relay -> peer name -> {bytes_in, bytes_out, connections}."""
        with self._lock:
            links = list(self.links)
        names = self.namer.name_all([ln.peer for ln in links])
        out: dict[str, dict[str, dict[str, int]]] = {}
        for ln in links:
            entry = out.setdefault(ln.relay, {}).setdefault(
                names[ln.peer], {"bytes_in": 0, "bytes_out": 0, "connections": 0}
            )
            entry["bytes_in"] += ln.bytes_in
            entry["bytes_out"] += ln.bytes_out
            entry["connections"] += 1
        return out

    def sample(self) -> None:
        flat = {
            f"{relay}|{peer}": [v["bytes_in"], v["bytes_out"]]
            for relay, peers in self.totals().items()
            for peer, v in peers.items()
        }
        with self._lock:
            self.points.append((round(time.time() - self.started, 3), flat))
            if len(self.points) > MAX_POINTS:  # halve the resolution, keep the span
                self.points = self.points[::2]
                self.interval *= 2

    def start_sampling(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.sample()

        threading.Thread(target=loop, name="traffic-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def to_json(self) -> dict[str, Any]:
        totals = self.totals()
        with self._lock:
            points = list(self.points)
        return {
            "started": self.started,
            "relays": totals,
            "timeline": {
                "interval_s": self.interval,
                "points": [{"t": t, "bytes": flat} for t, flat in points],
            },
        }


class Relay:
    """Listens on ``listen`` and forwards each connection to ``upstream``, counting bytes.

    ``stats`` (with ``secret``) answers :func:`fetch_stats` requests on the same port.
    The upstream may start later than the relay (a TensorFlow server takes seconds to
    import): a new connection waits up to ``connect_timeout`` for it rather than being
    refused, which would push gRPC clients into exponential reconnect back-off.
    """

    def __init__(
        self,
        name: str,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        book: TrafficBook,
        stats: Callable[[], dict] | None = None,
        secret: str = "",
        connect_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.book = book
        self.stats = stats
        self.secret = secret
        self.connect_timeout = connect_timeout
        self._upstream_seen = False
        self.sock: socket.socket | None = None

    def bind(self) -> None:
        """Bind the public address now, so a taken port fails at once and clearly."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(self.listen)
        except OSError as exc:
            sock.close()
            raise OSError(
                exc.errno,
                f"cannot listen on {self.listen[0]}:{self.listen[1]} "
                f"for {self.name}: {exc.strerror}",
            ) from None
        sock.listen(128)
        self.sock = sock

    def start(self) -> None:
        if self.sock is None:
            self.bind()
        threading.Thread(target=self._accept_loop, name=f"relay-{self.name}", daemon=True).start()

    def _accept_loop(self) -> None:
        assert self.sock is not None
        while True:
            try:
                client, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client, peer), daemon=True).start()

    def _is_stats_request(self, client: socket.socket) -> bytes | None:
        """The request word (MAGIC or WHO) a shipyard client opened with, else None."""
        if self.stats is None:
            return None
        client.settimeout(5.0)
        try:
            head = b""
            while True:
                head = client.recv(len(MAGIC), socket.MSG_PEEK)
                words = [w for w in (MAGIC, WHO) if w.startswith(head[: len(w)])]
                if not head or not words:
                    return None
                done = [w for w in words if head[: len(w)] == w]
                if done:
                    return done[0]
                time.sleep(0.005)
        except OSError:  # a client that says nothing: relay it like any other
            return None
        finally:
            client.settimeout(None)

    def _answer_stats(self, client: socket.socket, word: bytes = MAGIC) -> None:
        with client:
            client.settimeout(5.0)
            data = b""
            while not data.endswith(b"\n") and len(data) < 4096:
                chunk = client.recv(4096)
                if not chunk:
                    return
                data += chunk
            given, *address = data[len(word) :].strip().decode("ascii", "replace").split()
            if not hmac.compare_digest(given, self.secret):
                return
            if word == WHO:
                client.sendall(self._local_label(address).encode())
                return
            assert self.stats is not None
            client.sendall(json.dumps(self.stats()).encode())

    @staticmethod
    def _local_label(address: list[str]) -> str:
        """The label of the process of this instance that owns ``ip port`` ('' if none)."""
        try:
            peer = (address[0], int(address[1]))
        except (IndexError, ValueError):
            return ""
        pid = PeerNamer._local_owners({peer}).get(peer)
        return (PeerNamer._label_of(pid) or "") if pid is not None else ""

    def _connect_upstream(self) -> socket.socket | None:
        # waiting is for a server still starting; once it has answered, a refusal means it
        # is gone: the client learns so at once, as from the server itself (a gRPC client
        # kept waiting would time out its whole channel instead of failing over)
        timeout = UPSTREAM_GONE_S if self._upstream_seen else self.connect_timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                upstream = socket.create_connection(self.upstream, timeout=5.0)
                self._upstream_seen = True
                return upstream
            except OSError:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        peer = (_ipv4(peer[0]), peer[1])
        # name the peer while its process surely lives (the socket table forgets it after);
        # another instance's relay is asked only once this is known to be a relayed
        # connection (asking about a WHO asker would ask its relay back, and so on)
        local = threading.Thread(target=self.book.namer.find_local, args=([peer],), daemon=True)
        local.start()
        word = self._is_stats_request(client)
        if word is not None:
            self._answer_stats(client, word)
            return

        def name() -> None:
            local.join()
            self.book.namer.name_all([peer])

        threading.Thread(target=name, daemon=True).start()
        upstream = self._connect_upstream()
        if upstream is None:
            client.close()
            return
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = Link(self.name, peer)
        self.book.add(link)
        back = threading.Thread(
            target=_pump, args=(upstream, client, link, "bytes_out"), daemon=True
        )
        back.start()
        _pump(client, upstream, link, "bytes_in")
        back.join()
        link.closed = time.time()
        client.close()
        upstream.close()


def _pump(src: socket.socket, dst: socket.socket, link: Link, counter: str) -> None:
    buf = bytearray(_BUFFER)
    view = memoryview(buf)
    try:
        while True:
            n = src.recv_into(buf)
            if not n:
                break
            dst.sendall(view[:n])
            setattr(link, counter, getattr(link, counter) + n)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def fetch_stats(address: tuple[str, int], secret: str, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the relay at ``address`` for its process's traffic counters."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(MAGIC + secret.encode("ascii") + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    if not chunks:
        raise ConnectionError(
            f"no traffic counters from {address[0]}:{address[1]} "
            "(wrong job secret, or not a shipyard relay)"
        )
    return json.loads(b"".join(chunks))


def ask_who(relay: tuple[str, int], peer: tuple[str, int], secret: str) -> str | None:
    """The label a relay of another instance gives its local process at ``peer``."""
    try:
        with socket.create_connection(relay, timeout=2.0) as sock:
            sock.settimeout(2.0)
            sock.sendall(WHO + f"{secret} {peer[0]} {peer[1]}\n".encode("ascii"))
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode("utf-8", "replace").strip() or None


def peer_env(label: str) -> dict[str, str]:
    """Environment that names a process in every relay's counters."""
    return {LABEL_ENV: label}
