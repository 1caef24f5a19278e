"""What shipyard.ps's per-byte work costs without ZeroMQ: an estimate for the transport
decision in issue #4 (not a product path).

One client, two "shard" processes, plain sockets, 2 MiB chunks, the client sending and
receiving at once (a thread per direction and shard), ``recv_into`` straight into
preallocated arrays. Two variants, same run:

* ``raw echo``: the shard returns the bytes;
* ``raw + ps work``: the per-byte work of a push_pull: the client MACs each chunk, the
  shard verifies it, applies SGD with lr 0 in two numpy passes as shipyard.ps does, MACs
  the value and returns it, the client verifies it and copies it into the caller's array.

AES-GMAC throughout, as the ps default (one fixed key here: shipyard.ps derives one per
message, a few microseconds that do not matter at 2 MiB). The ratio says how much of raw
TCP that work leaves whatever carries the bytes; compare the absolute GB/s with
``benchmarks/ps_throughput.py``'s ``ps`` column.

Run:  python benchmarks/ps_work_bound.py [--sizes 5,100] [--runs 3] [--repeats 15]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import struct
import threading
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

CHUNK = 2 << 20
KEY = AESGCM(bytes(range(32)))  # the same in every process, whatever the start method
IV = bytes(12)
HEAD = struct.Struct("<II16s")  # chunk length, chunk index, GMAC tag (zeros when echoing)


def gmac(buf: np.ndarray) -> bytes:
    """GCM's tag with the buffer as additional data and no plaintext."""
    return KEY.encrypt(IV, b"", memoryview(buf).cast("B"))


def recv_into(conn: socket.socket, view: memoryview) -> None:
    while len(view):
        n = conn.recv_into(view)
        if not n:
            raise ConnectionError("peer closed")
        view = view[n:]


def shard(port_q: mp.Queue, work: bool) -> None:
    """Answer chunks until a zero length arrives: echo them, or verify, update, sign."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port_q.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    params: dict[int, np.ndarray] = {}
    scratch: dict[int, np.ndarray] = {}
    inbox: dict[int, np.ndarray] = {}
    head = bytearray(HEAD.size)
    while True:
        recv_into(conn, memoryview(head))
        n, index, tag = HEAD.unpack(head)
        if n == 0:
            return
        grad = inbox.setdefault(n, np.empty(n // 4, np.float32))  # reused, as shipyard.ps's
        recv_into(conn, memoryview(grad).cast("B"))  # tuned malloc reuses
        if not work:
            conn.sendall(head)
            conn.sendall(memoryview(grad).cast("B"))
            continue
        if gmac(grad) != tag:
            raise RuntimeError("MAC mismatch")
        param = params.get(index)
        if param is None:  # the first step initializes, as INIT does
            param = params[index] = grad.copy()
        tmp = scratch.setdefault(n, np.empty(n // 4, np.float32))
        np.multiply(grad, -0.0, out=tmp)  # SGD, lr 0: the same two passes as shipyard.ps
        param += tmp
        conn.sendall(HEAD.pack(n, index, gmac(param)))
        conn.sendall(memoryview(param).cast("B"))


def _one_shard(
    conn: socket.socket,
    data: np.ndarray,
    out: np.ndarray,
    chunks: list[tuple[int, int]],
    work: bool,
) -> None:
    """Send this shard's chunks from a thread while receiving the answers here."""

    def sender() -> None:
        for index, (a, b) in enumerate(chunks):
            piece = data[a:b]
            conn.sendall(HEAD.pack(piece.nbytes, index, gmac(piece) if work else bytes(16)))
            conn.sendall(memoryview(piece).cast("B"))

    thread = threading.Thread(target=sender)
    thread.start()
    head = bytearray(HEAD.size)
    buf = np.empty(CHUNK // 4, np.float32)
    for a, b in chunks:
        recv_into(conn, memoryview(head))
        piece = buf[: b - a]
        recv_into(conn, memoryview(piece).cast("B"))
        if work:
            if gmac(piece) != HEAD.unpack(head)[2]:
                raise RuntimeError("MAC mismatch")
            np.copyto(out[a:b], piece)
    thread.join()


def run(total_bytes: int, work: bool, repeats: int) -> float:
    """Median GB/s (both directions) of ``repeats`` steps over two fresh shards."""
    queues = [mp.Queue() for _ in range(2)]
    procs = [mp.Process(target=shard, args=(q, work), daemon=True) for q in queues]
    for p in procs:
        p.start()
    conns = []
    for q in queues:
        c = socket.create_connection(("127.0.0.1", q.get()))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(c)
    data = np.random.default_rng(0).random(total_bytes // 4, dtype=np.float32)
    out = np.empty_like(data)
    step_items = CHUNK // 4
    chunks = [(i, min(i + step_items, len(data))) for i in range(0, len(data), step_items)]
    shares = [chunks[0::2], chunks[1::2]]

    def step() -> float:
        threads = [
            threading.Thread(target=_one_shard, args=(c, data, out, s, work))
            for c, s in zip(conns, shares)
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start

    for _ in range(2):
        step()
    times = [step() for _ in range(repeats)]
    for c in conns:
        c.sendall(HEAD.pack(0, 0, bytes(16)))
        c.close()
    for p in procs:
        p.join(10)
    if work and not np.array_equal(out, data):
        raise RuntimeError("lr 0: values must come back unchanged")
    return 2 * total_bytes / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="5,100", help="model sizes in MB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    ratios: dict[str, float] = {}
    for mb in (int(s) for s in args.sizes.split(",")):
        runs = []
        for _ in range(args.runs):
            plain = run(mb * 1_000_000, False, args.repeats)
            worked = run(mb * 1_000_000, True, args.repeats)
            runs.append(worked / plain)
            print(
                f"{mb} MB: raw echo {plain:.2f} GB/s, raw + ps work {worked:.2f} GB/s, "
                f"ratio {worked / plain:.2f}",
                flush=True,
            )
        ratios[f"mb{mb}"] = statistics.median(runs)
    from _result import result

    result("ps_work_bound", **ratios)


if __name__ == "__main__":
    main()
