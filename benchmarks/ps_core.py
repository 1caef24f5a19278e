"""The shipyard.ps shard core's own cost per request: no sockets, no threads, no client.

Why: ``ServerCore.handle`` is the whole server-side path of a request (decode and
verify, the consistency gate, the optimizer update, the stats and the encoded reply),
and a refactor of it must not make that path slower. Through real processes
(ps_throughput.py) its share is buried in transport noise on a shared machine; here the
request frames, encoded beforehand (each with its own sequence number: the replay guard
drops a repeated one), are handed to ``handle`` in a loop, as server.py does.

Cases (SGD with lr 0, so values never drift; the gmac MAC as by default):

* ``pp1k``:  PUSH_PULL of one 1 KiB float32 tensor, one worker, async.
* ``many64``: PUSH_PULL_MANY of 64 tensors of 1 KiB (the small-gradient bucket), async.
* ``pp1m``:  PUSH_PULL of one 1 MiB tensor (MAC + update + copy dominate).
* ``sync1k``: two workers, sync mode: each PUSH_PULL of 1 KiB; the second closes the round.

Each figure is the median over ``--repeats`` runs of the microseconds per ``handle``
call (``sync1k``: per pair of calls), in CPU time of the calling thread: the core is
single-threaded, and on a shared machine wall-clock time mostly measures the neighbours.

Run:  python benchmarks/ps_core.py [--repeats 7] [--iters 3000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _result import result  # noqa: E402
from shipyard.ps import wire  # noqa: E402
from shipyard.ps.consistency import Consistency  # noqa: E402
from shipyard.ps.core import ServerConfig, ServerCore  # noqa: E402
from shipyard.ps.wire import Header, MsgType  # noqa: E402

SECRET = "benchmark-secret"


def _frames(signer: wire.Signer, hdr: Header, payload: list) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in wire.encode(signer, hdr, payload)]


def _fresh(signer: wire.Signer, hdr: Header, payload: list, count: int) -> list[list[bytes]]:
    """``count`` encodings of one request, each with its own sequence number (the shard's
    replay guard drops a repeated one), sharing the payload bytes."""
    frames = _frames(signer, hdr, payload)
    body = frames[1:-1]
    out = []
    for _ in range(count):
        enc = wire.encode(signer, hdr, body)
        out.append([bytes(enc[0]), *body, bytes(enc[-1])])
    return out


def _core(mode: str, sizes: dict[int, int], workers: int) -> tuple[ServerCore, wire.Signer]:
    core = ServerCore(ServerConfig(consistency=Consistency.parse(mode, None)), SECRET)
    signer = wire.Signer(SECRET)
    keys = [
        {"id": k, "name": f"t{k}", "shape": [n // 4], "dtype": "float32"} for k, n in sizes.items()
    ]
    body = {"keys": keys, "optimizer": {"name": "sgd", "lr": 0.0}}
    for w in range(workers):
        hdr = Header(msg_type=MsgType.REGISTER, worker=w, request_id=1, peer=core.signer.session)
        out = core.handle(b"p", [bytes(f) for f in wire.encode_json(signer, hdr, body)], 0.0)
        assert out, "register got no reply"
    for k, n in sizes.items():
        value = np.zeros(n // 4, np.float32)
        init = _header(MsgType.INIT, k, n, 0, peer=core.signer.session)
        core.handle(b"p", _frames(signer, init, [value]), 0.0)
    return core, signer


def _header(
    mtype: MsgType, key: int, nbytes: int, worker: int, step: int = 0, peer: int = 0
) -> Header:
    return Header(
        msg_type=mtype,
        key=key,
        worker=worker,
        request_id=2,
        peer=peer,  # the shard's session: requests naming another are dropped as stale
        step=step,
        dtype=wire.dtype_code(np.dtype(np.float32)),
        shape=(nbytes // 4,),
        nbytes=nbytes,
    )


def _run(core: ServerCore, rounds: list[list[list[bytes]]], replies: int) -> float:
    """CPU microseconds per round; each round's requests are fresh encodings."""
    handle = core.handle
    iters = len(rounds)
    start = time.thread_time()
    for requests in rounds:
        for frames in requests:
            out = handle(b"p", frames, 0.0)
            for o in out:
                if o.hold is not None:
                    o.hold.released = True
    elapsed = time.thread_time() - start
    assert len(out) == replies, f"expected {replies} replies, got {len(out)}"
    return elapsed / iters * 1e6


def case_pp(nbytes: int, iters: int) -> float:
    core, signer = _core("async", {1: nbytes}, 1)
    grad = np.ones(nbytes // 4, np.float32)
    hdr = _header(MsgType.PUSH_PULL, 1, nbytes, 0, peer=core.signer.session)
    return _run(core, [[r] for r in _fresh(signer, hdr, [grad], iters)], 1)


def case_many(count: int, iters: int) -> float:
    sizes = {k: 1024 for k in range(1, count + 1)}
    core, signer = _core("async", sizes, 1)
    hdr = Header(msg_type=MsgType.PUSH_PULL_MANY, worker=0, request_id=3, peer=core.signer.session)
    frames = [np.ones(256, np.float32) for _ in sizes]
    reqs = _fresh(signer, hdr, [wire.pack_keys(list(sizes)), *frames], iters)
    return _run(core, [[r] for r in reqs], 1)


def case_sync(iters: int) -> float:
    core, signer = _core("sync", {1: 1024}, 2)
    grad = np.ones(256, np.float32)
    # the step is ignored by the sync gate (rounds are counted per key); each worker its
    # own session, as real workers have (one counter for both would outrun the replay
    # window: worker 1's numbers would all be far ahead of worker 0's)
    per_worker = [
        _fresh(
            signer if w == 0 else wire.Signer(SECRET),
            _header(MsgType.PUSH_PULL, 1, 1024, w, peer=core.signer.session),
            [grad],
            iters,
        )
        for w in (0, 1)
    ]
    return _run(core, [list(pair) for pair in zip(*per_worker)], 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3000)
    args = ap.parse_args()
    cases = {
        "pp1k_us": lambda: case_pp(1024, args.iters),
        "many64_us": lambda: case_many(64, max(1, args.iters // 20)),
        "pp1m_us": lambda: case_pp(1 << 20, max(1, args.iters // 10)),
        "sync1k_us": lambda: case_sync(args.iters),
    }
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):  # interleaved, so machine noise hits every case alike
        for name, fn in cases.items():
            runs[name].append(fn())
    for name, values in runs.items():
        print(
            f"{name:10s} median {statistics.median(values):8.2f}  "
            + " ".join(f"{v:.2f}" for v in values)
        )
    result("ps_core", **{name: round(statistics.median(v), 2) for name, v in runs.items()})


if __name__ == "__main__":
    main()
