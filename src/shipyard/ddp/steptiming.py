"""torch DDP's step times, compute apart from communication, with no change to the script.

Loaded by the DDP ``sitecustomize`` (``ddp/_hook``) in a job's processes; it imports no
torch itself: when ``torch.nn.parallel.distributed`` is imported, its
``DistributedDataParallel`` (what ``torch_distributed``, ``pytorchddp`` and shipyard's
``smdistributed.dataparallel`` shim all build) is patched:

* a step is the time between two forwards that will synchronize gradients (grad
  enabled, not inside ``no_sync()``): forward, backward, the optimizer and the next
  batch's loading; the first forward only starts the clock (start-up is kept apart);
* communication is seen through DDP's communication hook, the one place DDP hands each
  gradient bucket to the process group: the hook the user registers is wrapped, and
  when the user registers none, at the first forward torch's own ``allreduce_hook``
  (what DDP's built-in reduction does: divide by the group's size, allreduce) is
  registered, timed. Each bucket's allreduce runs from its hook call (the bucket's
  gradients are ready) to its future's completion. The step *waited* for the exchange
  from the last bucket's hook call (backward's compute is over) to the last completion:
  that is its communication; the rest of the exchange ran behind backward (overlap).
  Bytes per step are the buckets' sizes.

A user's ``register_comm_hook`` or ``_register_builtin_comm_hook`` after the first forward
would now find a hook registered (torch allows one): DDP's documentation has hooks
registered before training, and the built-in kind is left alone (its steps are timed
without communication). Python 3.7-compatible: jobs may run old frameworks.
"""

import functools
import os
import threading
import time

from shipyard.runtime import postimport
from shipyard.runtime.steptiming import shared

SOURCE = "torch DDP"
MODULE = "torch.nn.parallel.distributed"
_recorder = None


class _Buckets:
    """One DDP module's bucket exchanges since the last step boundary (hook calls happen
    on autograd's thread, completions on the process group's)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._spans = []  # [start, end or None, bytes]

    def started(self, nbytes):
        span = [time.perf_counter(), None, nbytes]
        with self._lock:
            self._spans.append(span)
        return span

    @staticmethod
    def done(span):
        span[1] = time.perf_counter()

    def take(self):
        """(waited, overlapped, bytes) of the buckets since the last call, or None."""
        with self._lock:
            spans, self._spans = self._spans, []
        spans = [s for s in spans if s[1] is not None]
        if not spans:
            return None
        last_ready = max(s[0] for s in spans)  # backward's compute is over
        finished = max(s[1] for s in spans)
        waited = max(0.0, finished - last_ready)
        overlap = max(0.0, _span_length([(s[0], s[1]) for s in spans]) - waited)
        return waited, overlap, sum(s[2] for s in spans)


def _span_length(spans):
    """Seconds covered by the (start, end) spans together (overlaps counted once)."""
    total = 0.0
    end_so_far = None
    for start, end in sorted(spans):
        if end_so_far is None or start > end_so_far:
            total += end - start
            end_so_far = end
        elif end > end_so_far:
            total += end - end_so_far
            end_so_far = end
    return total


def _timed(hook, buckets):
    """``hook`` with each bucket's exchange timed (the same signature, so DDP's checks of
    the hook's annotations and its logged name see the user's hook)."""

    @functools.wraps(hook)
    def timed(state, bucket):
        try:
            buffer = bucket.buffer()
            nbytes = buffer.numel() * buffer.element_size()
        except (AttributeError, RuntimeError):  # an unusual bucket: timed without its size
            nbytes = 0
        span = buckets.started(nbytes)
        future = hook(state, bucket)

        def finished(fut):
            buckets.done(span)
            return fut.value()

        return future.then(finished)

    return timed


def _patch(module):
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None or getattr(ddp, "_shipyard_steps", False) or _recorder is None:
        return
    register = getattr(ddp, "register_comm_hook", None)
    forward = ddp.forward
    builtin = getattr(ddp, "_register_builtin_comm_hook", None)

    def buckets_of(self):
        found = self.__dict__.get("_shipyard_buckets")
        if found is None:
            found = self.__dict__["_shipyard_buckets"] = _Buckets()
        return found

    def register_comm_hook(self, state, hook):
        self.__dict__["_shipyard_hooked"] = True
        return register(self, state, _timed(hook, buckets_of(self)))

    def register_builtin(self, comm_hook_type):
        self.__dict__["_shipyard_hooked"] = True  # C++ reduces: steps timed without comm
        return builtin(self, comm_hook_type)

    def timed_forward(self, *args, **kwargs):
        import torch

        if torch.is_grad_enabled() and getattr(self, "require_backward_grad_sync", True):
            if not self.__dict__.get("_shipyard_hooked") and register is not None:
                self.__dict__["_shipyard_hooked"] = True
                try:
                    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                    register(
                        self,
                        self.process_group,
                        _timed(default_hooks.allreduce_hook, buckets_of(self)),
                    )
                except (ImportError, AttributeError, RuntimeError, TypeError, ValueError):
                    # an old or unusual DDP: its steps are timed without communication
                    pass
            if _recorder.claim(SOURCE):
                exchanged = buckets_of(self).take()
                if exchanged is not None:
                    waited, overlap, nbytes = exchanged
                    _recorder.comm(waited, overlap, nbytes)
                _recorder.mark()
        return forward(self, *args, **kwargs)

    if register is not None:
        ddp.register_comm_hook = functools.wraps(register)(register_comm_hook)
    if builtin is not None:
        ddp._register_builtin_comm_hook = functools.wraps(builtin)(register_builtin)
    ddp.forward = functools.wraps(forward)(timed_forward)
    ddp._shipyard_steps = True


def install(path):
    """Time every DDP module's steps of this process into ``path``."""
    global _recorder
    if _recorder is not None or not path:
        return
    _recorder = shared(path, SOURCE, os.environ.get("CURRENT_HOST"))
    postimport.when_imported({MODULE: _patch})
