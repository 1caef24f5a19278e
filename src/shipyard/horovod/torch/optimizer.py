"""``DistributedOptimizer``: gradient allreduce overlapped with backward.

How it works
------------
* Buckets. Parameters (per device and dtype, in *reverse* registration order, since
  backward produces the last layers' gradients first) are cut into buckets of at most
  ``HOROVOD_FUSION_THRESHOLD`` bytes (64 MiB by default); the first bucket is capped at
  1 MiB so communication starts early (DDP's trick). ``groups=``/``num_groups=`` override
  the cut, as in Horovod.
* Gradients live in the buckets. Each parameter's ``.grad`` is made a view into its
  bucket's flat buffer, so autograd accumulates straight into the fusion buffer and the
  buffer is reduced in place: no pack/unpack copies. (If something replaces ``p.grad``,
  e.g. ``model.zero_grad()`` setting it to None, the hook copies the fresh gradient into
  the bucket once and re-points ``p.grad``.) ``optimizer.zero_grad()`` zeroes the buffers
  and keeps the views (``set_to_none`` is ignored for that reason).
* Hooks. ``register_post_accumulate_grad_hook`` fires when a parameter's gradient is
  complete. After ``backward_passes_per_step`` firings the parameter is ready; a bucket
  whose parameters are all ready is handed to the engine's communication thread.
  Buckets are launched strictly in bucket order, so every rank issues the same
  collectives in the same order whatever order its hooks fire in.
* Communication thread. One background thread owns the ``bg`` MPI channel and runs the
  buckets' negotiation + in-place ``MPI_Allreduce`` while backward goes on in the caller's
  thread (MPI_THREAD_MULTIPLE; see engine.py). ``synchronize()`` launches whatever did
  not fire (unused parameters contribute zeros, as in Horovod), waits for all buckets,
  and ``step()`` calls it unless inside ``skip_synchronize()``.
* CUDA parameters: buckets live on the GPU and are reduced with NCCL (untested here).
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from typing import cast

import torch

from .. import engine as _engine
from ..fusion import FIRST_BUCKET_BYTES, plan_batches
from ..ops import Adasum, Average, check_process_set, global_process_set, op_name
from . import _nccl
from .compression import Compression


class _Bucket:
    __slots__ = (
        "buffer",
        "desc",
        "handle",
        "index",
        "label",
        "names",
        "offsets",
        "params",
        "pending",
        "ready",
        "segments",
        "views",
    )

    def __init__(self, index, params, names):
        self.index = index
        self.params = params
        self.names = names
        self.offsets = []
        off = 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        p0 = params[0]
        self.buffer = torch.zeros(off, dtype=p0.dtype, device=p0.device)
        self.views = [
            self.buffer[o : o + p.numel()].view_as(p) for o, p in zip(self.offsets, params)
        ]
        self.segments = [(o, o + p.numel()) for o, p in zip(self.offsets, params)]
        self.pending = len(params)
        self.ready = [False] * len(params)
        self.handle = None
        self.desc = None
        self.label = names[0] + (f" +{len(names) - 1}" if len(names) > 1 else "")


class _DistributedOptimizer:
    """Mixed into a dynamic subclass of the wrapped optimizer's class (as Horovod does), so
    ``isinstance(opt, torch.optim.SGD)`` and LR schedulers keep working."""

    def _hvd_setup(
        self,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        num_groups,
        sparse_as_dense,
    ):
        eng = _engine.get()
        self._hvd_engine = eng
        self._hvd_compression = compression
        self._hvd_op = op
        self.backward_passes_per_step = int(backward_passes_per_step)
        if self.backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor != 1.0 needs op=Average")
        self._hvd_prescale = 1.0 / gradient_predivide_factor
        self._hvd_postscale = float(gradient_predivide_factor)
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_lock = threading.Lock()
        self._hvd_should_sync = True
        self._hvd_synchronized = False

        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        seen = set()
        unique = []
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                unique.append(p)
        params = unique

        names = {}
        if named_parameters is not None:
            named = list(named_parameters)
            if named and not isinstance(named[0], tuple):
                raise ValueError(
                    "named_parameters should be a sequence of (name, parameter) tuples, "
                    "usually model.named_parameters()"
                )
            all_names = [n for n, _ in named]
            dups = sorted({n for n in all_names if all_names.count(n) > 1})
            if dups:
                raise ValueError(
                    f"parameter names in named_parameters must be unique; duplicates: {dups[:5]}"
                )
            names = {id(p): n for n, p in named}
            unnamed = [p for p in params if id(p) not in names]
            if unnamed:
                raise ValueError(
                    f"named_parameters was given but {len(unnamed)} optimizer parameters are not in it"
                )
        for i, p in enumerate(params):
            names.setdefault(id(p), f"allreduce.noname.{i}")
        self._hvd_names = names

        # Cut buckets.
        order = list(reversed(params))
        plan: list[list[torch.Tensor]] = []
        if groups is not None:
            grouped = set()
            for g in groups:
                members = [p for p in g if p.requires_grad]
                grouped.update(id(p) for p in members)
                if members:
                    plan.append(members)
            rest = [p for p in order if id(p) not in grouped]
            plan += [[p] for p in rest]
        elif num_groups and num_groups > 0:
            k = -(-len(order) // num_groups)
            plan = [order[i : i + k] for i in range(0, len(order), k)]
        else:
            by_kind: dict[tuple, list[torch.Tensor]] = {}
            kinds = []
            for p in order:
                key = (p.device, p.dtype)
                if key not in by_kind:
                    by_kind[key] = []
                    kinds.append(key)
                by_kind[key].append(p)
            for key in kinds:
                ps = by_kind[key]
                nbytes = [p.numel() * p.element_size() for p in ps]
                for batch in plan_batches(
                    nbytes, eng.fusion_threshold, first_cap=FIRST_BUCKET_BYTES
                ):
                    plan.append([ps[j] for j in batch])
        # A bucket must be homogeneous in device and dtype.
        split_plan = []
        for members in plan:
            cur = []
            for p in members:
                if cur and (p.device, p.dtype) != (cur[0].device, cur[0].dtype):
                    split_plan.append(cur)
                    cur = []
                cur.append(p)
            if cur:
                split_plan.append(cur)

        self._hvd_buckets: list[_Bucket] = []
        self._hvd_where: dict[int, tuple[_Bucket, int]] = {}
        for i, members in enumerate(split_plan):
            b = _Bucket(i, members, [names[id(p)] for p in members])
            comp_dtype = (
                torch.float16
                if (compression is Compression.fp16 and members[0].dtype.is_floating_point)
                else members[0].dtype
            )
            b.desc = (
                "allreduce",
                tuple(b.names),
                str(comp_dtype),
                tuple(tuple(p.shape) for p in members),
                (("op", op_name(op)), ("pre", self._hvd_prescale), ("post", self._hvd_postscale)),
            )
            self._hvd_buckets.append(b)
            for j, p in enumerate(members):
                self._hvd_where[id(p)] = (b, j)
                with torch.no_grad():
                    if p.grad is not None:
                        b.views[j].copy_(p.grad.to_dense() if p.grad.is_sparse else p.grad)
                    p.grad = b.views[j]
        if any(p.is_cuda for p in params) and _nccl.use_nccl():
            _nccl.ensure_group()  # collective: here, on the caller's thread, not in the comm thread
        self._hvd_delay = {id(p): self.backward_passes_per_step for p in params}
        self._hvd_next = 0
        self._hvd_hooks = [p.register_post_accumulate_grad_hook(self._hvd_hook) for p in params]

    # ------------------------------------------------------------------ hooks and launch
    def _hvd_hook(self, p: torch.Tensor) -> None:
        b, j = self._hvd_where[id(p)]
        view = b.views[j]
        g = p.grad
        if g is not None and g is not view and (g.is_sparse or g.data_ptr() != view.data_ptr()):
            with torch.no_grad():
                view.copy_(g.to_dense() if g.is_sparse else g)
            p.grad = view
        delay = self._hvd_delay[id(p)] - 1
        if delay < 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate gradients locally."
            )
        self._hvd_delay[id(p)] = delay
        if delay == 0:
            self._hvd_mark_ready(b, j)

    def _hvd_mark_ready(self, b: _Bucket, j: int) -> None:
        with self._hvd_lock:
            if b.ready[j]:
                return
            b.ready[j] = True
            b.pending -= 1
            if b.pending == 0:
                self._hvd_launch_ready()

    def _hvd_launch_ready(self) -> None:
        buckets = self._hvd_buckets
        while self._hvd_next < len(buckets) and buckets[self._hvd_next].pending == 0:
            b = buckets[self._hvd_next]
            b.handle = self._hvd_engine.submit(lambda ctx, b=b: self._hvd_reduce(ctx, b), b.label)
            self._hvd_next += 1

    def _hvd_reduce(self, ctx, b: _Bucket) -> None:
        """Runs on the communication thread."""
        eng = self._hvd_engine
        buf = b.buffer
        op = self._hvd_op
        if buf.is_cuda:
            _nccl.allreduce_(buf, b.label, op, self._hvd_prescale, self._hvd_postscale, ctx=ctx)
            return
        compressed = (
            self._hvd_compression is Compression.fp16
            and buf.dtype.is_floating_point
            and buf.dtype != torch.float16
        )
        if compressed:
            work = buf.to(torch.float16)
        elif buf.dtype == torch.bfloat16:
            work = buf.float()
        else:
            work = buf
        arr = work.numpy()
        if op == Adasum:
            eng.executor.adasum_flat(ctx, arr, b.desc, b.segments)
        else:
            eng.executor.reduce_flat(
                ctx,
                arr,
                b.desc,
                op,
                self._hvd_prescale,
                self._hvd_postscale,
                b.label,
                {"tensors": len(b.params)},
            )
        if work is not buf:
            buf.copy_(work)

    # ------------------------------------------------------------------ public API
    def synchronize(self) -> None:
        """Finish the allreduce of every gradient (launching those whose hooks did not fire)."""
        for b in self._hvd_buckets:
            for j, p in enumerate(b.params):
                if not b.ready[j]:
                    view = b.views[j]
                    g = p.grad
                    with torch.no_grad():
                        if g is None:
                            view.zero_()
                        elif g is not view and (g.is_sparse or g.data_ptr() != view.data_ptr()):
                            view.copy_(g.to_dense() if g.is_sparse else g)
                    p.grad = view
                    self._hvd_mark_ready(b, j)
        with self._hvd_lock:
            self._hvd_launch_ready()
        error = None
        for b in self._hvd_buckets:
            try:
                if b.handle is not None:
                    b.handle.wait()
            except BaseException as e:  # noqa: BLE001 - wait for every bucket before raising
                error = error or e
        for b in self._hvd_buckets:
            b.handle = None
            b.pending = len(b.params)
            b.ready = [False] * len(b.params)
        self._hvd_next = 0
        for k in self._hvd_delay:
            self._hvd_delay[k] = self.backward_passes_per_step
        self._hvd_synchronized = True
        if error is not None:
            raise error

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For ``optimizer.synchronize(); clip...; with optimizer.skip_synchronize(): optimizer.step()``."""
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure=None):
        waited = time.perf_counter()
        if self._hvd_should_sync:
            if self._hvd_synchronized:
                warnings.warn(
                    "optimizer.step() called after optimizer.synchronize() without skip_synchronize(): "
                    "gradients are synchronized again (wasted communication). Use "
                    "`with optimizer.skip_synchronize(): optimizer.step()`.",
                    stacklevel=2,
                )
            self.synchronize()
        waited = time.perf_counter() - waited  # the exchange backward did not hide
        self._hvd_synchronized = False
        result = super().step(closure)
        steps = getattr(self._hvd_engine, "steps", None)  # shipyard times each step (engine.py)
        if steps is not None and steps.claim("horovod allreduce"):
            steps.comm(waited)
            steps.mark()
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        if any(b.handle is not None for b in self._hvd_buckets):
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition."
            )
        for b in self._hvd_buckets:
            b.buffer.zero_()
            for p, view in zip(b.params, b.views):
                if p.grad is not view:
                    p.grad = view
        # Parameters outside the buckets (requires_grad=False now, ...) keep torch's behaviour.
        bucketed = self._hvd_where
        # self is also the wrapped torch optimizer (this class is mixed in front of its class)
        for g in cast(torch.optim.Optimizer, self).param_groups:
            for p in g["params"]:
                if id(p) not in bucketed and p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_()
                        p.grad.zero_()

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = int(passes)
        for k in self._hvd_delay:
            self._hvd_delay[k] = self.backward_passes_per_step


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=global_process_set,
):
    """Wrap a torch optimizer so ``step()`` uses gradients averaged (``op``) over all ranks.

    Returns an object of a subclass of ``optimizer``'s class sharing its state and param
    groups (LR schedulers made for either keep working).
    """
    check_process_set(process_set)
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("the optimizer is already a DistributedOptimizer")  # noqa: TRY004 (Horovod raises ValueError)
    base = optimizer.__class__
    cls = type(
        base.__name__,
        (_DistributedOptimizer, base),
        {"__module__": base.__module__, "__qualname__": base.__qualname__},
    )
    obj = cls.__new__(cls)
    obj.__dict__.update(optimizer.__dict__)
    obj._hvd_setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        num_groups,
        sparse_as_dense,
    )
    return obj
