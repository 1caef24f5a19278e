"""What shipyard.ps's per-byte work costs without ZeroMQ: an estimate for the transport
decision in issue #4 (not a product path).

One client, two "shard" processes, plain sockets, 2 MiB chunks, the client sending and
receiving at once (a thread per direction and shard), ``recv_into`` straight into
preallocated arrays. Two variants, same run: ``raw echo`` (the shard returns the bytes)
and ``raw + ps work`` (the per-byte work of a push_pull: the client MACs each chunk, the
shard verifies it, applies SGD with lr 0 in two numpy passes as shipyard.ps does, MACs
the value and returns it, the client verifies and copies it into the caller's array).
AES-GMAC throughout, as the ps default. The ratio says how much of raw TCP that work
leaves, whatever the transport; compare with ``benchmarks/ps_throughput.py``'s ratio.

Run:  python benchmarks/ps_work_bound.py
"""
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
IV = bytes(12)  # one-time keys in shipyard.ps; a fixed key is fine for timing
def gmac(buf): return KEY.encrypt(IV, b"", memoryview(buf).cast("B"))  # GHASH over the buffer as AAD
def recv_into(conn, view):
    while len(view):
        n = conn.recv_into(view); view = view[n:]
def shard(port_q, work):
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1); port_q.put(ls.getsockname()[1])
    conn, _ = ls.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    params = {}
    hdr = bytearray(4 + 16)
    while True:
        try: recv_into(conn, memoryview(hdr))
        except Exception: return
        (n,) = struct.unpack_from("<I", hdr)
        if n == 0: return
        g = np.empty(n // 4, np.float32); recv_into(conn, memoryview(g).cast("B"))
        if work:
            if gmac(g) != bytes(hdr[4:]):
                raise RuntimeError("MAC mismatch")
            p = params.get(n)
            if p is None: p = params[n] = np.zeros(n // 4, np.float32)
            tmp = np.multiply(g, -0.0); p += tmp
            tag = gmac(p); conn.sendall(struct.pack("<I", n) + tag); conn.sendall(memoryview(p).cast("B"))
        else:
            conn.sendall(bytes(hdr)); conn.sendall(memoryview(g).cast("B"))
def run(total, work, repeats):
    qs = [mp.Queue() for _ in range(2)]
    procs = [mp.Process(target=shard, args=(q, work), daemon=True) for q in qs]
    for p in procs: p.start()
    conns = []
    for q in qs:
        c = socket.create_connection(("127.0.0.1", q.get())); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); conns.append(c)
    data = np.random.rand(total // 4).astype(np.float32); out = np.empty_like(data)
    chunks = [(i, min(i + CHUNK // 4, len(data))) for i in range(0, len(data), CHUNK // 4)]
    per = [chunks[0::2], chunks[1::2]]
    def step():
        def one(conn, cs):
            def sender():
                for a, b in cs:
                    v = data[a:b]; tag = gmac(v) if work else bytes(16)
                    conn.sendall(struct.pack("<I", v.nbytes) + tag); conn.sendall(memoryview(v).cast("B"))
            t = threading.Thread(target=sender); t.start()
            hdr = bytearray(20); buf = np.empty(CHUNK // 4, np.float32)
            for a, b in cs:
                recv_into(conn, memoryview(hdr)); v = buf[:b - a]; recv_into(conn, memoryview(v).cast("B"))
                if work:
                    if gmac(v) != bytes(hdr[4:]):
                        raise RuntimeError("MAC mismatch")
                    np.copyto(out[a:b], v)
            t.join()
        ts = [threading.Thread(target=one, args=(c, cs)) for c, cs in zip(conns, per)]
        t0 = time.perf_counter()
        for t in ts: t.start()
        for t in ts: t.join()
        return time.perf_counter() - t0
    for _ in range(2): step()
    times = [step() for _ in range(repeats)]
    for c in conns: c.sendall(struct.pack("<I", 0) + bytes(16)); c.close()
    return 2 * total / statistics.median(times) / 1e9
if __name__ == "__main__":
    for mb in (5, 100):
        for _ in range(3):
            plain = run(mb * 1_000_000, False, 15); worked = run(mb * 1_000_000, True, 15)
            print(f"{mb} MB: raw echo {plain:.2f} GB/s, raw + ps work {worked:.2f} GB/s, ratio {worked/plain:.2f}", flush=True)
