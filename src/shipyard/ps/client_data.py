"""``PSClient``'s data path: push, pull, push_pull and its split-phase form.

Why its own module: this is what a training step calls. It checks every array against
its registration before anything is sent, cuts tensors into their placed chunks, and
reassembles replies into the caller's arrays (``outs``) or fresh ones. The split-phase
form lets framework hooks put gradients on the wire as backward produces them, with
small ones held back in a bucket so they still share messages.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from shipyard.runtime.steptiming import StepRecorder

from . import wire
from .buffers import array_view
from .client_exchange import Exchange
from .client_requests import Request, RequestBuilder
from .client_state import ClientState
from .errors import (
    ShapeMismatchError,
    UnknownKeyError,
)
from .placement import Chunk, KeyPlacement
from .wire import Message, MsgType


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` is a view of exactly ``b``'s bytes."""
    return bool(
        a.nbytes == b.nbytes
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


_DTYPES: dict[str, np.dtype] = {}


def _dtype(name: str) -> np.dtype:
    """``np.dtype(name)``, looked up once per name (every call checks every array)."""
    dt = _DTYPES.get(name)
    if dt is None:
        dt = _DTYPES[name] = np.dtype(name)
    return dt


# push_pull_begin holds small tensors back until this much waits or push_pull_end
# comes, so that hooks firing one tensor at a time still share messages
BUCKET_BYTES = 256 * 1024

# push_pull of one tensor below this size, with nothing else in flight, takes the
# one-request path (push_pull_one): its reply is copied out of the stream's staging
# buffer anyway (stream.SMALL), so no receive-into-place is lost
ONE_MAX_BYTES = 64 * 1024

ArrayLike = Any


class DataPath:
    """The training step's calls, over a client's requests and exchange.

    Owns what a split-phase push_pull has in progress (the bucket of small requests
    held back, the request ids on the wire and the arrays their values land in)."""

    def __init__(self, state: ClientState, requests: RequestBuilder, exchange: Exchange) -> None:
        self._state = state
        self._requests = requests
        self._exchange = exchange
        self.bucket: list[Request] = []  # small push_pull_begin requests not sent yet
        self._bucket_keys: set[int] = set()
        self._bucket_bytes = 0
        self.open: list[int] = []  # a split-phase push_pull in progress: its request ids
        self._open_result: dict[str, np.ndarray] = {}
        # this worker's step times (runtime/steptiming.py), when the client records them
        self.recorder: StepRecorder | None = None
        # a split-phase step's overlap: when its first begin call came (perf_counter), and
        # the seconds its begin calls took (the worker's own sending, not compute)
        self._first_sent: float | None = None
        self._begin_s = 0.0

    @property
    def keys(self) -> list[str]:
        return list(self._state.keys)

    def placement(self, name: str) -> KeyPlacement:
        try:
            return self._state.keys[name]
        except KeyError:
            raise UnknownKeyError(f"{name!r} was not registered with this client") from None

    def send_reqs(self, tensors: Mapping[str, ArrayLike], mtype: MsgType) -> list[Request]:
        """One request per chunk of every tensor (INIT or PUSH; no reply payload)."""
        reqs = []
        for name, value in tensors.items():
            kp = self.placement(name)
            arr = self._check(kp, value)
            flat = arr.reshape(-1)
            for c in kp.chunks:
                payload = arr if c.whole else flat[c.offset : c.offset + c.length]
                reqs.append(self._requests.tensor(kp, c, mtype, payload, None))
        return reqs

    def push(self, key: str, grad: ArrayLike) -> None:
        """Send one gradient for the current ``step``; returns once every shard accepted it."""
        self.push_all({key: grad})

    def push_all(self, grads: Mapping[str, ArrayLike]) -> None:
        """Send several gradients at once (pipelined over all shards)."""
        t0 = time.perf_counter()
        self._exchange.exchange(self.send_reqs(grads, MsgType.PUSH))
        self._timed(t0)

    def pull(self, key: str, out: np.ndarray | None = None) -> np.ndarray:
        """Current value of ``key`` (waits as the consistency mode requires)."""
        return self.pull_all([key], outs={key: out} if out is not None else None)[key]

    def pull_all(
        self, keys: Iterable[str] | None = None, outs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Current values of ``keys`` (default: all registered), pipelined."""
        names = list(self._state.keys) if keys is None else list(keys)
        result: dict[str, np.ndarray] = {}
        reqs = []
        for name in names:
            kp = self.placement(name)
            reqs.extend(self._pull_reqs(kp, None, MsgType.PULL, result, (outs or {}).get(name)))
        t0 = time.perf_counter()
        self._exchange.exchange(reqs)
        self._timed(t0)
        return {n: result[n] for n in names}

    def _stepped(self, comm_s: float, overlap_s: float | None = None) -> None:
        """A step ended: its communication seconds (with any push/pull since the last
        step) go to the step recorder, which times the step from the previous one;
        ``overlap_s``: the seconds its requests travelled behind the worker's compute."""
        if self.recorder is not None:
            self.recorder.comm(comm_s, overlap=overlap_s)
            self.recorder.mark()

    def _timed(self, t0: float) -> None:
        """Communication since ``t0`` that does not end a step (push, pull, begin)."""
        if self.recorder is not None:
            self.recorder.comm(time.perf_counter() - t0)

    def push_pull(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Push every gradient and get back the updated values in one round trip per
        chunk, then advance ``step``. Keys without a gradient are not pulled."""
        t0 = time.perf_counter()
        result = self._push_pull(grads, outs)
        self._stepped(time.perf_counter() - t0)
        return result

    def _push_pull(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None
    ) -> dict[str, np.ndarray]:
        if len(grads) == 1 and not (self._exchange.busy or self.bucket):
            one = self._push_pull_one(grads, outs)
            if one is not None:
                return one
        result: dict[str, np.ndarray] = {}
        reqs = []
        for name, g in grads.items():
            kp = self.placement(name)
            arr = self._check(kp, g)
            reqs.extend(self._pull_reqs(kp, arr, MsgType.PUSH_PULL, result, (outs or {}).get(name)))
        self._flush_bucket()  # a split-phase step's held-back requests go first, in order
        self._exchange.exchange(self._requests.grouped(reqs))
        self._state.step += 1
        return {n: result[n] for n in grads}

    def _push_pull_one(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None
    ) -> dict[str, np.ndarray] | None:
        """push_pull of one small tensor kept whole on one shard, with nothing else in
        flight (a small model's step, a latency-bound call): one message out, its reply
        in, without the request objects, grouping, pipelining and per-request callbacks
        the general path builds (~1/3 of a 1 KB round trip's client CPU). The same
        checks, header, MAC, replay guard, error mapping and timeout as the general
        path; None when the call is not of this shape (the general path takes it)."""
        ((name, g),) = grads.items()
        kp = self._state.keys.get(name)
        if kp is None or len(kp.chunks) != 1:
            return None
        c = kp.chunks[0]
        arr = self._check(kp, g)
        if not c.whole or arr.nbytes >= ONE_MAX_BYTES:
            return None
        out = outs.get(name) if outs else None
        if out is not None and (
            out.shape != kp.spec.shape
            or out.dtype != _dtype(kp.spec.dtype)
            or not out.flags.c_contiguous
        ):
            raise ShapeMismatchError(
                f"out for {name!r} must be a C-contiguous {kp.spec.dtype} array of shape {kp.spec.shape}"
            )
        msg = self._exchange.round_trip_one(
            c.shard, MsgType.PUSH_PULL, c.key_id, arr, wire.dtype_code(kp.spec.dtype), name
        )
        if msg is None:  # another thread's request is in flight
            return None
        if out is None:
            value = msg.tensor().copy()  # a small value arrives as (read-only) bytes
        else:
            frame = msg.payload[0] if len(msg.payload) == 1 else None
            dt = msg.dtype
            if (
                dt is not None
                and dt == out.dtype
                and frame is not None
                and len(frame) == out.nbytes > 0
            ):
                # what copyto below does for a reply of out's dtype and size: one byte
                # copy into out (C-contiguous, checked above), without two reshapes,
                # frombuffer and the copyto dispatch
                array_view(out).cast("B")[:] = frame
            else:  # the reply's own dtype and shape (decode checked they fit)
                value = msg.tensor()
                np.copyto(out.reshape(-1), value.reshape(-1))  # ValueError if it does not fit
            value = out
        self._state.step += 1
        return {name: value}

    def push_pull_begin(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Split-phase push_pull, part 1: put these gradients on the wire and return at
        once (call it as gradients become ready, e.g. from backward hooks). Pieces under
        GROUP_MAX_BYTES wait until BUCKET_BYTES of them gather or ``push_pull_end``
        comes, then go one message per shard. The arrays must stay unchanged until
        ``push_pull_end``."""
        t0 = time.perf_counter()
        self._push_pull_begin(grads, outs)
        took = time.perf_counter() - t0
        if self._first_sent is None:
            self._first_sent = t0
        self._begin_s += took
        if self.recorder is not None:
            self.recorder.comm(took)

    def _push_pull_begin(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None
    ) -> None:
        reqs = []
        for name, g in grads.items():
            kp = self.placement(name)
            arr = self._check(kp, g)
            reqs.extend(
                self._pull_reqs(
                    kp, arr, MsgType.PUSH_PULL, self._open_result, (outs or {}).get(name)
                )
            )
        now = []
        for r in reqs:
            if not (self._state.many and self._requests.groupable(r)):
                now.append(r)
                continue
            if r.header.key in self._bucket_keys:  # pushed twice before an end: keep both, in order
                self._flush_bucket()
            self.bucket.append(r)
            self._bucket_keys.add(r.header.key)
            self._bucket_bytes += r.nbytes
        if now:
            self.open.extend(self._exchange.send(now))
        if self._bucket_bytes >= BUCKET_BYTES:
            self._flush_bucket()

    def _flush_bucket(self) -> None:
        """Send the small requests push_pull_begin held back (one message per shard)."""
        if not self.bucket:
            return
        bucket, self.bucket, self._bucket_keys, self._bucket_bytes = self.bucket, [], set(), 0
        self.open.extend(self._exchange.send(self._requests.grouped(bucket)))

    def push_pull_end(self) -> dict[str, np.ndarray]:
        """Split-phase push_pull, part 2: wait for every reply since the last end,
        advance ``step`` and return the updated values."""
        t0 = time.perf_counter()
        self._flush_bucket()
        rids, self.open = self.open, []
        result, self._open_result = self._open_result, {}
        self._exchange.wait(rids)
        self._state.step += 1
        self._stepped(time.perf_counter() - t0, self._overlap(t0))
        return result

    def _overlap(self, end_at: float) -> float | None:
        """Seconds this split-phase step's requests were on the wire while the worker
        computed: from its first push_pull_begin to push_pull_end, less the time inside its
        begin calls (the worker's own sending; None: no begin this step). Why: gradients pushed from backward's
        hooks travel while the rest of backward runs; the step's push/pull wait alone
        hides that (issue 39: at 1.25 Gbit/s the demo's CNN waited 20 ms a step where its
        link needs 37 ms), and the planner predicts another link's step from this window."""
        first, self._first_sent = self._first_sent, None
        spent, self._begin_s = self._begin_s, 0.0
        if first is None:
            return None
        return max(0.0, end_at - first - spent)

    def next_step(self) -> int:
        """Advance this worker's step counter (after a manual push/pull sequence)."""
        self._state.step += 1
        self._stepped(0.0)
        return self._state.step

    def _pull_reqs(
        self,
        kp: KeyPlacement,
        grad: np.ndarray | None,
        mtype: MsgType,
        result: dict[str, np.ndarray],
        out: np.ndarray | None,
    ) -> list[Request]:
        name = kp.spec.name
        if out is not None:
            if (
                out.shape != kp.spec.shape
                or out.dtype != _dtype(kp.spec.dtype)
                or not out.flags.c_contiguous
            ):
                raise ShapeMismatchError(
                    f"out for {name!r} must be a C-contiguous {kp.spec.dtype} array of shape {kp.spec.shape}"
                )
        single = len(kp.chunks) == 1 and kp.chunks[0].whole
        if not single:
            full = out if out is not None else np.empty(kp.spec.shape, dtype=kp.spec.dtype)
            result[name] = full
            flat_out = full.reshape(-1)
        flat_g = grad.reshape(-1) if grad is not None else None
        reqs = []
        for c in kp.chunks:
            if single:
                dest = out.reshape(-1) if out is not None else None
            else:
                dest = flat_out[c.offset : c.offset + c.length]

            def on_reply(m: Message, c: Chunk = c, dest: np.ndarray | None = dest) -> None:
                arr = m.tensor()
                if (  # a small value arrives as bytes: never in place
                    dest is not None
                    and not (m.payload and type(m.payload[0]) is bytes)
                    and _same_memory(arr, dest)
                ):
                    pass  # the transport received the value right into place
                elif single and out is None:
                    if not arr.flags.writeable:  # a transport that hands out read-only buffers
                        arr = arr.copy()
                    result[name] = arr
                    return
                else:
                    assert dest is not None
                    np.copyto(dest, arr.reshape(-1))
                if single and out is not None:  # (None returned above)
                    result[name] = out

            payload = None
            if flat_g is not None:  # a gradient to push
                payload = grad if c.whole else flat_g[c.offset : c.offset + c.length]
            req = self._requests.tensor(kp, c, mtype, payload, on_reply)
            req.dest = dest.view(np.uint8) if dest is not None else None
            reqs.append(req)
        return reqs

    def _check(self, kp: KeyPlacement, value: ArrayLike) -> np.ndarray:
        arr = value if type(value) is np.ndarray else np.asarray(value)
        if arr.shape != kp.spec.shape:
            raise ShapeMismatchError(
                f"{kp.spec.name}: shape {tuple(arr.shape)} differs from registered {kp.spec.shape}"
            )
        if arr.dtype != _dtype(kp.spec.dtype):
            raise ShapeMismatchError(
                f"{kp.spec.name}: dtype {arr.dtype} differs from registered {kp.spec.dtype}"
            )
        return np.ascontiguousarray(arr)
