"""``PSClient``: a worker's handle on all shards of a parameter server.

Why it looks like this: a training step pushes every gradient and pulls every
parameter; with several shards the fast way is to put all requests on the wire
at once (one socket per shard, pipelined) and collect the replies as they come,
hashing the next message while the previous one is in flight. Placement is
computed locally (every worker computes the same one), so no lookup service is
needed; tensors larger than the chunk size are split and reassembled here.

Typical use (rank from ``SHIPYARD_PS_RANK``, endpoints from
``SHIPYARD_PS_ENDPOINTS``, secret from ``SHIPYARD_PS_SECRET``)::

    with PSClient() as ps:
        params = ps.register(model_params, optimizer={"name": "adam", "lr": 1e-3})
        for batch in data:
            grads = compute(params, batch)
            params = ps.push_pull(grads)       # push every gradient, pull fresh values
        print(ps.stats())                      # placement + traffic report (stats.py)

Errors: bad arguments raise ``PSConfigError`` / ``ShapeMismatchError`` /
``UnknownKeyError`` before anything is sent; a shard's error reply raises the
matching ``RemoteError``; no reply in ``timeout`` seconds raises ``PSTimeoutError``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import wire
from .errors import (
    PSConfigError,
    PSError,
    PSTimeoutError,
    RemoteError,
    ReplayedMessageError,
    ShapeMismatchError,
    UnknownKeyError,
    WireError,
    remote_error,
)
from .optimizers import make_optimizer
from .placement import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    KeyPlacement,
    PlacementReport,
    TensorSpec,
    as_specs,
    place,
)
from .stats import build_report
from .transport import SocketTransport, Transport, tune_malloc
from .wire import Header, Message, MsgType

log = logging.getLogger("shipyard.ps.client")

ENDPOINTS_ENV = "SHIPYARD_PS_ENDPOINTS"
RANK_ENV = "SHIPYARD_PS_RANK"
TIMEOUT_ENV = "SHIPYARD_PS_TIMEOUT"
HEARTBEAT_ENV = "SHIPYARD_PS_HEARTBEAT"
REPORT_ENV = "SHIPYARD_PS_REPORT"  # rank 0 writes the stats report here when it closes
POLICY_ENV = "SHIPYARD_PS_POLICY"  # placement policy when register() is not given one
DEFAULT_TIMEOUT = 300.0
CLIENT_MALLOC_KEEP = (
    256 << 20
)  # reply buffers reused instead of page-faulted in (transport.tune_malloc)
PARALLEL_DECODE_MIN = 256 * 1024  # replies larger than this are verified on the hash pool
# push_pull sends the tensors below this size, per shard, in one PUSH_PULL_MANY message:
# a round trip costs ~90 us of CPU (client and shard) whatever its size, and a model has
# many small tensors (biases, norms): the tutorial CNN's 14 messages per step become 6,
# and its push+pull went from ~0.46 to ~0.51 of raw TCP (BENCHMARKS.md). 256 KiB (4
# messages) measured no better.
GROUP_MAX_BYTES = 64 * 1024
GROUP_MAX_COUNT = 1024
# push_pull_begin holds such small tensors back until this much waits or push_pull_end
# comes, so that hooks firing one tensor at a time still share messages
BUCKET_BYTES = 256 * 1024

ArrayLike = Any


def endpoints_from_env() -> list[str]:
    value = os.environ.get(ENDPOINTS_ENV, "")
    eps = [e.strip() for e in value.split(",") if e.strip()]
    if not eps:
        raise PSConfigError(
            f"no shard endpoints: pass endpoints=[...] or set {ENDPOINTS_ENV}="
            "'tcp://host:port,tcp://host:port' (shard 0 first)"
        )
    return eps


def _env_float(name: str, default: float) -> float:
    v = os.environ.get(name)
    if v in (None, ""):
        return default
    try:
        return float(v)
    except ValueError:
        raise PSConfigError(f"{name}={v!r} is not a number") from None


@dataclass
class _Req:
    """One request: how to encode it and what to do with its reply."""

    shard: int
    header: Header
    on_reply: Callable[[Message], None]
    label: str
    make: Callable[[bool], list]  # make(parallel) -> frames
    nbytes: int = 0
    payload: np.ndarray | None = None  # a gradient to push (PUSH_PULL), for grouping


def _ignore(msg: Message) -> None:
    return None


class PSClient:
    """A worker's connection to every shard.

    ``endpoints`` lists shard endpoints in shard-index order (default
    ``$SHIPYARD_PS_ENDPOINTS``); ``worker_id`` is this worker's rank (default
    ``$SHIPYARD_PS_RANK`` or 0); ``secret`` defaults to ``$SHIPYARD_PS_SECRET``.
    ``transport_factory`` builds a Transport (the seam); it is called once for
    requests and once more for the heartbeat thread when ``heartbeat_interval``
    is set (default ``$SHIPYARD_PS_HEARTBEAT`` or 1 s; 0 disables). ``mac``
    picks the MAC algorithm (default ``$SHIPYARD_PS_MAC``, else aes-gmac when
    ``cryptography`` is installed, else ``hmac-sha256``).
    """

    def __init__(
        self,
        endpoints: Sequence[str] | None = None,
        *,
        worker_id: int | None = None,
        secret: str | bytes | None = None,
        timeout: float | None = None,
        heartbeat_interval: float | None = None,
        transport_factory: Callable[[], Transport] | None = None,
        mac: str | None = None,
        connect: bool = True,
    ) -> None:
        tune_malloc(CLIENT_MALLOC_KEEP)
        if transport_factory is None:
            eps = list(endpoints) if endpoints is not None else endpoints_from_env()
            self.endpoints: list[str] = eps

            def transport_factory() -> Transport:
                return SocketTransport(eps)

        else:
            self.endpoints = list(endpoints or [])
        if worker_id is None:
            try:
                worker_id = int(os.environ.get(RANK_ENV, "0") or 0)
            except ValueError:
                raise PSConfigError(f"{RANK_ENV} must be an integer") from None
        if not 0 <= worker_id <= wire.U32_MAX:
            raise PSConfigError(f"worker_id must be in [0, 2**32), got {worker_id}")
        self.worker_id = worker_id
        self._secret = wire.secret_from_env(secret)
        self._mac = mac
        self.signer = wire.Signer(self._secret, mac)
        # replies must be new and addressed to this client's session (wire.ReplayGuard)
        self._guard = wire.ReplayGuard(self.signer.session)
        # SHA-256 segments are hashed on the pool; BLAKE3 threads itself (GIL held)
        self._pool_hash = self.signer.alg == wire.MAC_HMAC_SHA256
        self.timeout = timeout if timeout is not None else _env_float(TIMEOUT_ENV, DEFAULT_TIMEOUT)
        self._factory = transport_factory
        self.transport: Transport = transport_factory()
        self.num_shards = self.transport.num_shards
        if not self.endpoints:
            self.endpoints = [f"shard-{i}" for i in range(self.num_shards)]
        self.step = 0
        self.shard_info: list[dict[str, Any]] = []
        self._peers = [0] * self.num_shards  # each shard's session, learned in hello()
        self.report: PlacementReport | None = None
        self._keys: dict[str, KeyPlacement] = {}
        self._rids = itertools.count(1)
        self._closed = False
        self._servers_down = False
        self._lock = threading.RLock()  # one thread on the sockets at a time
        self._pending: dict[int, _Req] = {}  # request id -> request, until its reply
        self._results: dict[int, Any] = {}  # request id -> None | error | Future, until waited for
        self._many = False  # every shard takes PUSH_PULL_MANY (learned in hello)
        self._bucket: list[_Req] = []  # small push_pull_begin requests not sent yet
        self._bucket_keys: set[int] = set()
        self._bucket_bytes = 0
        self._open: list[int] = []  # a split-phase push_pull in progress
        self._open_result: dict[str, np.ndarray] = {}
        hb = (
            heartbeat_interval if heartbeat_interval is not None else _env_float(HEARTBEAT_ENV, 1.0)
        )
        self._hb_interval = hb
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        if connect:
            try:
                self.hello()
                if hb and hb > 0:
                    self._start_heartbeats()
            except BaseException:
                self.close(leave=False)
                raise

    # lifecycle ---------------------------------------------------------------------
    def hello(self) -> list[dict[str, Any]]:
        """Join every shard; checks shard order and sets ``step`` to where this worker resumes."""
        infos: list[dict[str, Any] | None] = [None] * self.num_shards

        def keep(i: int) -> Callable[[Message], None]:
            def cb(m: Message) -> None:
                infos[i] = m.json()

            return cb

        body = {"worker": self.worker_id, "pid": os.getpid()}
        self._exchange(
            [
                self._json_req(i, MsgType.HELLO, body, keep(i), "hello")
                for i in range(self.num_shards)
            ]
        )
        for i, info in enumerate(infos):
            assert info is not None
            if info.get("shard") != i or info.get("num_shards") != self.num_shards:
                raise PSConfigError(
                    f"endpoint {self.endpoints[i]} is shard {info.get('shard')} of {info.get('num_shards')}, "
                    f"expected shard {i} of {self.num_shards}: list endpoints in shard order"
                )
        self.shard_info = [dict(x) for x in infos if x is not None]
        self._many = all("push_pull_many" in (x.get("features") or ()) for x in self.shard_info)
        modes = {json_key(x.get("consistency")) for x in self.shard_info}
        if len(modes) > 1:
            raise PSConfigError(f"shards disagree on consistency: {sorted(modes)}")
        self.step = max((int(x.get("step", 0)) for x in self.shard_info), default=0)
        return self.shard_info

    def _learn_sessions(self, timeout: float | None = None) -> None:
        """Say HELLO to the shards whose session this client does not know yet (a client
        made with ``connect=False``): every other request must name it (replay guard)."""
        missing = [i for i in range(self.num_shards) if not self._peers[i]]
        if missing:
            body = {"worker": self.worker_id, "pid": os.getpid()}
            self._exchange(
                [self._json_req(i, MsgType.HELLO, body, None, "hello") for i in missing], timeout
            )

    def close(self, leave: bool = True) -> None:
        """Stop heartbeats, tell shards this worker leaves (``leave=True``), close sockets.

        Rank 0 first writes the report to ``$SHIPYARD_PS_REPORT`` when that is set
        (what ``shipyard describe`` shows), best effort."""
        if self._closed:
            return
        report_path = os.environ.get(REPORT_ENV)
        if report_path and self.worker_id == 0 and leave and not self._servers_down:
            try:
                self.write_report(report_path, timeout=min(self.timeout, 5.0))
            except (PSError, OSError) as exc:
                log.warning(
                    "could not write the parameter-server report to %s: %s", report_path, exc
                )
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=5)
        if leave and not self._servers_down:
            try:  # short: at the end of a job the shards may already be gone
                self._exchange(
                    [
                        self._json_req(i, MsgType.LEAVE, {}, None, "leave")
                        for i in range(self.num_shards)
                    ],
                    timeout=min(self.timeout, 2.0),
                )
            except PSError as exc:
                log.warning("leave not acknowledged: %s", exc)
        self._closed = True
        self.transport.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_heartbeats(self) -> None:
        # its own session: its messages travel on their own connections, so their
        # numbers must not interleave with the requests' (each session is in order)
        signer = wire.Signer(self._secret, self._mac)

        def run() -> None:
            t = self._factory()
            try:
                while not self._hb_stop.wait(self._hb_interval):
                    for i in range(t.num_shards):
                        hdr = Header(
                            msg_type=MsgType.HEARTBEAT,
                            worker=self.worker_id,
                            shard=i,
                            step=self.step,
                            mac_alg=signer.alg,
                            peer=self._peers[i],
                        )
                        t.send(i, wire.encode(signer, hdr))
            except Exception as exc:  # noqa: BLE001  # pragma: no cover - socket torn down at exit
                log.debug("heartbeat thread stopped: %s", exc)
            finally:
                t.close()

        self._hb_thread = threading.Thread(
            target=run, name=f"ps-heartbeat-{self.worker_id}", daemon=True
        )
        self._hb_thread.start()

    # registration --------------------------------------------------------------
    def register(
        self,
        params: Mapping[str, ArrayLike] | Sequence[TensorSpec] | Iterable[tuple[str, ArrayLike]],
        optimizer: Any = None,
        *,
        policy: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        init: bool | None = None,
        groups: Mapping[str, str] | None = None,
        optimizers: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """Place and declare the parameters, initialize them, and return their current values.

        ``params``: name -> array (creation order kept), or TensorSpecs (no values).
        ``optimizer``: the server-side optimizer config for all keys (a name, a dict
        like ``{"name": "adam", "lr": 1e-3}`` or an ``optimizers.Optimizer``); or
        ``optimizers`` (group -> config) with ``groups`` (key -> group) for
        per-group settings. ``init`` (default: rank 0) sends the values; the first
        writer wins, so a shard that resumed from a checkpoint keeps its values.
        Other ranks wait for the values to be initialized and pull them.
        """
        items = list(params.items()) if isinstance(params, Mapping) else list(params)
        given: list[Any] = []
        values: dict[str, np.ndarray | None] = {}
        for item in items:
            if isinstance(item, TensorSpec):
                given.append(item)
                values[item.name] = None
            else:
                name, value = item
                arr = np.asarray(value)
                given.append((name, arr))
                values[name] = arr
        specs = as_specs(given)
        policy = policy or os.environ.get(POLICY_ENV) or "auto"
        report = place(specs, self.num_shards, policy, chunk_bytes)
        limit = min((int(x.get("max_message_bytes") or 0) for x in self.shard_info), default=0)
        too_big = [
            (k.spec.name, c.nbytes)
            for k in report.chosen.keys
            for c in k.chunks
            if limit and c.nbytes > limit
        ]
        if too_big:
            raise PSConfigError(
                f"{too_big[0][0]}: a {too_big[0][1]}-byte message exceeds the shards' limit of {limit} "
                "bytes; use policy='sliced' with chunk_bytes below the limit, or raise --max-message-bytes"
            )
        self.report = report
        self._keys = {k.spec.name: k for k in self.report.chosen.keys}
        group_cfg = dict(optimizers) if optimizers is not None else {"default": optimizer}
        group_of = dict(groups or {})
        for name, g in group_of.items():
            if name not in self._keys:
                raise UnknownKeyError(f"groups names {name!r}, which is not among the parameters")
            if g not in group_cfg:
                raise PSConfigError(f"group {g!r} of {name!r} has no entry in optimizers")
        opt_cfgs = {
            g: (make_optimizer(c).config() if c is not None else None)  # validate first
            for g, c in group_cfg.items()
        }
        if init is None:
            init = self.worker_id == 0
        reqs = []
        for shard in range(self.num_shards):
            for g, cfg in group_cfg.items():
                entries = []
                for kp in self.report.chosen.keys:
                    if group_of.get(kp.spec.name, "default") != g:
                        continue
                    for c in kp.chunks:
                        if c.shard == shard:
                            entries.append(
                                {
                                    "id": c.key_id,
                                    "name": kp.spec.name,
                                    "chunk": c.index,
                                    "offset": c.offset,
                                    "shape": list(kp.chunk_shape(c)),
                                    "dtype": kp.spec.dtype,
                                }
                            )
                if not entries and cfg is None:
                    continue
                body = {"keys": entries, "optimizer": opt_cfgs[g], "group": g}
                if init and shard == 0 and g == next(iter(group_cfg)):  # for the job's final report
                    body["placement"] = report.to_json()
                reqs.append(self._json_req(shard, MsgType.REGISTER, body, None, f"register {g}"))
        self._exchange(reqs)
        if init:
            missing = [n for n, v in values.items() if v is None]
            if missing:
                raise PSConfigError(f"init needs values; no array given for {missing[:3]}")
            self._init_all({n: v for n, v in values.items() if v is not None})
        return self.pull_all()

    def _init_all(self, values: Mapping[str, np.ndarray]) -> None:
        self._exchange(self._send_reqs(values, MsgType.INIT))

    def _send_reqs(self, tensors: Mapping[str, ArrayLike], mtype: MsgType) -> list[_Req]:
        """One request per chunk of every tensor (INIT or PUSH; no reply payload)."""
        reqs = []
        for name, value in tensors.items():
            kp = self.placement(name)
            arr = self._check(kp, value)
            flat = arr.reshape(-1)
            for c in kp.chunks:
                payload = arr if c.whole else flat[c.offset : c.offset + c.length]
                reqs.append(self._tensor_req(kp, c, mtype, payload, None))
        return reqs

    @property
    def keys(self) -> list[str]:
        return list(self._keys)

    def placement(self, name: str) -> KeyPlacement:
        try:
            return self._keys[name]
        except KeyError:
            raise UnknownKeyError(f"{name!r} was not registered with this client") from None

    # data path -----------------------------------------------------------------
    def push(self, key: str, grad: ArrayLike) -> None:
        """Send one gradient for the current ``step``; returns once every shard accepted it."""
        self.push_all({key: grad})

    def push_all(self, grads: Mapping[str, ArrayLike]) -> None:
        """Send several gradients at once (pipelined over all shards)."""
        self._exchange(self._send_reqs(grads, MsgType.PUSH))

    def pull(self, key: str, out: np.ndarray | None = None) -> np.ndarray:
        """Current value of ``key`` (waits as the consistency mode requires)."""
        return self.pull_all([key], outs={key: out} if out is not None else None)[key]

    def pull_all(
        self, keys: Iterable[str] | None = None, outs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Current values of ``keys`` (default: all registered), pipelined."""
        names = list(self._keys) if keys is None else list(keys)
        result: dict[str, np.ndarray] = {}
        reqs = []
        for name in names:
            kp = self.placement(name)
            reqs.extend(self._pull_reqs(kp, None, MsgType.PULL, result, (outs or {}).get(name)))
        self._exchange(reqs)
        return {n: result[n] for n in names}

    def push_pull(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Push every gradient and get back the updated values in one round trip per
        chunk, then advance ``step``. Keys without a gradient are not pulled."""
        result: dict[str, np.ndarray] = {}
        reqs = []
        for name, g in grads.items():
            kp = self.placement(name)
            arr = self._check(kp, g)
            reqs.extend(self._pull_reqs(kp, arr, MsgType.PUSH_PULL, result, (outs or {}).get(name)))
        self._flush_bucket()  # a split-phase step's held-back requests go first, in order
        self._exchange(self._grouped(reqs))
        self.step += 1
        return {n: result[n] for n in grads}

    def push_pull_begin(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Split-phase push_pull, part 1: put these gradients on the wire and return at
        once (call it as gradients become ready, e.g. from backward hooks). Pieces under
        GROUP_MAX_BYTES wait until BUCKET_BYTES of them gather or ``push_pull_end``
        comes, then go one message per shard. The arrays must stay unchanged until
        ``push_pull_end``."""
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
            if not (self._many and self._groupable(r)):
                now.append(r)
                continue
            if r.header.key in self._bucket_keys:  # pushed twice before an end: keep both, in order
                self._flush_bucket()
            self._bucket.append(r)
            self._bucket_keys.add(r.header.key)
            self._bucket_bytes += r.nbytes
        if now:
            self._open.extend(self._send(now))
        if self._bucket_bytes >= BUCKET_BYTES:
            self._flush_bucket()

    def _flush_bucket(self) -> None:
        """Send the small requests push_pull_begin held back (one message per shard)."""
        if not self._bucket:
            return
        bucket, self._bucket, self._bucket_keys, self._bucket_bytes = self._bucket, [], set(), 0
        self._open.extend(self._send(self._grouped(bucket)))

    def push_pull_end(self) -> dict[str, np.ndarray]:
        """Split-phase push_pull, part 2: wait for every reply since the last end,
        advance ``step`` and return the updated values."""
        self._flush_bucket()
        rids, self._open = self._open, []
        result, self._open_result = self._open_result, {}
        self._wait(rids)
        self.step += 1
        return result

    def next_step(self) -> int:
        """Advance this worker's step counter (after a manual push/pull sequence)."""
        self.step += 1
        return self.step

    def _pull_reqs(
        self,
        kp: KeyPlacement,
        grad: np.ndarray | None,
        mtype: MsgType,
        result: dict[str, np.ndarray],
        out: np.ndarray | None,
    ) -> list[_Req]:
        name = kp.spec.name
        if out is not None:
            if (
                tuple(out.shape) != kp.spec.shape
                or out.dtype != np.dtype(kp.spec.dtype)
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

            def on_reply(m: Message, c: Chunk = c) -> None:
                arr = m.tensor()
                if single:
                    if not arr.flags.writeable:  # a transport that hands out read-only buffers
                        arr = arr.copy()
                    if out is not None:
                        np.copyto(out, arr)
                        result[name] = out
                    else:
                        result[name] = arr
                else:
                    np.copyto(flat_out[c.offset : c.offset + c.length], arr.reshape(-1))

            payload = None
            if grad is not None:
                payload = grad if c.whole else flat_g[c.offset : c.offset + c.length]
            reqs.append(self._tensor_req(kp, c, mtype, payload, on_reply))
        return reqs

    def _check(self, kp: KeyPlacement, value: ArrayLike) -> np.ndarray:
        arr = np.asarray(value)
        if tuple(arr.shape) != kp.spec.shape:
            raise ShapeMismatchError(
                f"{kp.spec.name}: shape {tuple(arr.shape)} differs from registered {kp.spec.shape}"
            )
        if arr.dtype != np.dtype(kp.spec.dtype):
            raise ShapeMismatchError(
                f"{kp.spec.name}: dtype {arr.dtype} differs from registered {kp.spec.dtype}"
            )
        return np.ascontiguousarray(arr)

    # control ----------------------------------------------------------------------
    def set_lr(self, lr: float, group: str | None = None) -> None:
        """Change the server-side learning rate on every shard (all groups, or one)."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0 or lr != lr:
            raise PSConfigError(f"lr must be a number >= 0, got {lr!r}")
        body: dict[str, Any] = {"lr": float(lr)}
        if group is not None:
            body["group"] = group
        self._exchange(
            [
                self._json_req(i, MsgType.SET_LR, body, None, "set_lr")
                for i in range(self.num_shards)
            ]
        )

    def shard_stats(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Each shard's raw STATS reply."""
        self._learn_sessions(timeout)
        out: list[Any] = [None] * self.num_shards

        def keep(i: int) -> Callable[[Message], None]:
            def cb(m: Message) -> None:
                out[i] = m.json()

            return cb

        self._exchange(
            [
                self._json_req(i, MsgType.STATS, {}, keep(i), "stats")
                for i in range(self.num_shards)
            ],
            timeout,
        )
        return out

    def stats(self, timeout: float | None = None) -> dict[str, Any]:
        """The job report: placement + per-shard counters + traffic matrix (stats.py schema)."""
        return build_report(
            self.report.to_json() if self.report else None,
            self.shard_stats(timeout),
            self.endpoints,
        )

    def write_report(self, path: str, timeout: float | None = None) -> dict[str, Any]:
        """Write ``stats()`` as JSON to ``path`` atomically; returns the report."""
        report = self.stats(timeout)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, path)
        return report

    def checkpoint(self) -> list[str | None]:
        """Ask every shard to write a checkpoint now; returns the manifest paths."""
        paths: list[str | None] = [None] * self.num_shards

        def keep(i: int) -> Callable[[Message], None]:
            def cb(m: Message) -> None:
                paths[i] = (m.json() or {}).get("path")

            return cb

        self._exchange(
            [
                self._json_req(i, MsgType.CHECKPOINT, {}, keep(i), "checkpoint")
                for i in range(self.num_shards)
            ]
        )
        return paths

    def finish(
        self, exit_code: int, error: str = "", timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Tell every shard this worker's process ended (what the runner's worker wrapper
        sends) and wait until every worker of the job has ended; returns each shard's
        final answer: ``{"finished": {rank: outcome}, "stats": ..., "placement": ...}``."""
        self._learn_sessions(timeout)
        out: list[Any] = [None] * self.num_shards

        def keep(i: int) -> Callable[[Message], None]:
            def cb(m: Message) -> None:
                out[i] = m.json()

            return cb

        body = {"exit_code": int(exit_code), "error": error[-2000:]}
        self._exchange(
            [
                self._json_req(i, MsgType.DONE, body, keep(i), "done")
                for i in range(self.num_shards)
            ],
            timeout,
        )
        self._servers_down = True  # they stop right after answering
        return out

    def shutdown_servers(self) -> None:
        """Tell every shard to write its final checkpoint and exit."""
        self._exchange(
            [
                self._json_req(i, MsgType.SHUTDOWN, {}, None, "shutdown")
                for i in range(self.num_shards)
            ]
        )
        self._servers_down = True

    # plumbing ---------------------------------------------------------------------
    def _header(self, shard: int, mtype: MsgType, key: int = 0, **kw: Any) -> Header:
        # the MAC id is set here so encode() need not rebuild the (frozen) header per message
        if not self._peers[shard] and mtype != MsgType.HELLO:
            self._learn_sessions()
        return Header(
            msg_type=mtype,
            key=key,
            worker=self.worker_id,
            mac_alg=self.signer.alg,
            request_id=next(self._rids) & wire.U32_MAX,
            shard=shard,
            step=self.step,
            peer=self._peers[shard],
            **kw,
        )

    def _json_req(
        self,
        shard: int,
        mtype: MsgType,
        body: Any,
        on_reply: Callable[[Message], None] | None,
        label: str,
    ) -> _Req:
        hdr = self._header(shard, mtype)
        return _Req(
            shard,
            hdr,
            on_reply or _ignore,
            label,
            lambda parallel: wire.encode_json(self.signer, hdr, body),
        )

    def _tensor_req(
        self,
        kp: KeyPlacement,
        c: Chunk,
        mtype: MsgType,
        payload: np.ndarray | None,
        on_reply: Callable[[Message], None] | None,
    ) -> _Req:
        label = kp.spec.name if c.whole else f"{kp.spec.name}[chunk {c.index}]"
        if payload is None:
            hdr = self._header(c.shard, mtype, c.key_id)
            return _Req(
                c.shard,
                hdr,
                on_reply or _ignore,
                label,
                lambda parallel: wire.encode(self.signer, hdr),
            )
        hdr = self._header(
            c.shard,
            mtype,
            c.key_id,
            dtype=wire.dtype_code(kp.spec.dtype),
            shape=kp.chunk_shape(c),
            nbytes=int(payload.nbytes),
        )
        return _Req(
            c.shard,
            hdr,
            on_reply or _ignore,
            label,
            lambda parallel: wire.encode(self.signer, hdr, [payload], parallel=parallel),
            nbytes=int(payload.nbytes),
            payload=payload,
        )

    def _grouped(self, reqs: list[_Req]) -> list[_Req]:
        """Small PUSH_PULL requests to the same shard merged into one PUSH_PULL_MANY
        each (when every shard takes it); the others as they are, in order."""
        if not self._many:
            return reqs
        small: dict[int, list[_Req]] = {}
        for r in reqs:
            if self._groupable(r):
                small.setdefault(r.shard, []).append(r)
        groups = [members for members in small.values() if len(members) > 1]
        if not groups:
            return reqs
        merged = {id(r) for members in groups for r in members}
        out = [r for r in reqs if id(r) not in merged]
        for members in groups:
            for i in range(0, len(members), GROUP_MAX_COUNT):
                part = members[i : i + GROUP_MAX_COUNT]
                out.append(self._many_req(part) if len(part) > 1 else part[0])
        return out

    @staticmethod
    def _groupable(r: _Req) -> bool:
        """A small gradient push_pull, which may share a PUSH_PULL_MANY message."""
        return (
            r.header.msg_type == MsgType.PUSH_PULL
            and r.payload is not None
            and r.nbytes < GROUP_MAX_BYTES
        )

    def _many_req(self, members: list[_Req]) -> _Req:
        shard = members[0].shard
        hdr = self._header(shard, MsgType.PUSH_PULL_MANY)
        index = wire.pack_keys([m.header.key for m in members])
        payloads = [m.payload for m in members]

        def on_reply(msg: Message) -> None:
            h = msg.header
            if h.msg_type != MsgType.TENSORS or len(msg.payload) != len(members) + 1:
                raise RemoteError(
                    f"push_pull_many of {len(members)} tensors got a reply of type "
                    f"{h.msg_type} with {len(msg.payload)} frame(s)",
                    shard=shard,
                )
            try:
                keys, versions = wire.unpack_keys(msg.payload[0], len(members), versions=True)
            except WireError as err:
                raise RemoteError(str(err), shard=shard) from None
            for m, key, version, frame in zip(members, keys, versions, msg.payload[1:]):
                if key != m.header.key:
                    raise RemoteError(
                        f"push_pull_many reply lists key {key} where {m.header.key} was sent",
                        shard=shard,
                    )
                mh = m.header
                sub = Header(
                    msg_type=MsgType.TENSOR,
                    key=key,
                    worker=h.worker,
                    request_id=h.request_id,
                    shard=h.shard,
                    step=version,
                    dtype=mh.dtype,
                    shape=mh.shape,
                    nbytes=len(frame),
                )
                try:
                    m.on_reply(Message(header=sub, payload=[frame]))
                except WireError as err:  # a value frame that does not fit the tensor
                    raise RemoteError(f"{m.label}: {err}", shard=shard) from None

        names = ", ".join(m.label for m in members[:3]) + (", ..." if len(members) > 3 else "")
        return _Req(
            shard,
            hdr,
            on_reply,
            f"{len(members)} small tensors ({names})",
            lambda parallel: wire.encode(self.signer, hdr, [index, *payloads], parallel=parallel),
            nbytes=sum(m.nbytes for m in members),
        )

    def _exchange(self, reqs: Sequence[_Req], timeout: float | None = None) -> None:
        """Send all requests, then wait for every reply (see ``_send`` and ``_wait``)."""
        self._wait(self._send(reqs), timeout)

    def _send(self, reqs: Sequence[_Req]) -> list[int]:
        """Put requests on the wire; returns their request ids.

        Large messages are MAC'd on the hash pool, in order, while earlier ones are
        already on the wire.
        """
        if self._closed:
            raise PSError("this PSClient is closed")
        with self._lock:
            pool = wire._pool()
            n_big = sum(1 for r in reqs if r.nbytes >= PARALLEL_DECODE_MIN)
            use_pool = self._pool_hash and n_big > 1
            futures = [
                pool.submit(r.make, False) if use_pool and r.nbytes >= PARALLEL_DECODE_MIN else None
                for r in reqs
            ]
            rids = []
            for r, fut in zip(reqs, futures):
                frames = fut.result() if fut is not None else r.make(True)
                rid = r.header.request_id
                self._pending[rid] = r
                rids.append(rid)
                self.transport.send(r.shard, frames)
            return rids

    def _wait(self, rids: Sequence[int], timeout: float | None = None) -> None:
        """Receive until every request in ``rids`` has its reply; replies to other
        outstanding requests (a split-phase push_pull) are delivered on the way.
        Large replies are verified on the hash pool as they arrive. The first error
        is raised only after all of ``rids`` are in, so no stray reply is left behind."""
        timeout = self.timeout if timeout is None else timeout
        mine = set(rids)
        with self._lock:
            pool = wire._pool()
            deadline = time.monotonic() + timeout
            while mine & self._pending.keys():
                left = deadline - time.monotonic()
                ready = self.transport.poll(min(left, 1.0)) if left > 0 else []
                if not ready:
                    if time.monotonic() >= deadline:
                        late = {
                            rid: self._pending.pop(rid) for rid in list(mine & self._pending.keys())
                        }
                        for rid in mine:
                            self._results.pop(rid, None)
                        raise self._timeout_error(late, timeout)
                    continue
                deadline = time.monotonic() + timeout  # progress restarts the clock
                for shard in ready:
                    frames = self.transport.recv(shard)
                    try:
                        rid = wire.Header.unpack(frames[0]).request_id if frames else None
                    except WireError:
                        rid = None
                    r = self._pending.get(rid) if rid is not None else None
                    if r is None or r.shard != shard:
                        log.debug("dropping a reply that matches no pending request")
                        continue
                    del self._pending[rid]
                    # verify and deliver right away: the receive buffer is released
                    # at once and reused for the next reply (no page faults per step)
                    if (
                        self._pool_hash
                        and sum(len(memoryview(f).cast("B")) for f in frames) >= PARALLEL_DECODE_MIN
                    ):
                        self._results[rid] = pool.submit(self._receive, r, frames, False)
                    else:
                        res = self._receive(r, frames, True)
                        if isinstance(res, ReplayedMessageError):
                            # a copy of an old reply: not this request's answer; keep waiting
                            log.warning("dropped a reply that is not new: %s", res)
                            self._pending[rid] = r
                            continue
                        self._results[rid] = res
            errors = []
            for rid in rids:
                res = self._results.pop(rid, None)
                if isinstance(res, Future):
                    res = res.result()
                if res is not None:
                    errors.append(res)
            if errors:
                raise errors[0]

    def _receive(self, r: _Req, frames: list, parallel: bool) -> BaseException | None:
        """Authenticate one reply and hand it to its request; returns the error, if any."""
        try:
            self._deliver(r, wire.decode(self.signer, frames, None, parallel, guard=self._guard))
        except PSError as exc:
            return exc
        return None

    def _timeout_error(self, pending: Mapping[int, _Req], timeout: float) -> PSTimeoutError:
        waiting = sorted({f"shard {r.shard} ({self.endpoints[r.shard]})" for r in pending.values()})
        example = next(iter(pending.values())).label
        return PSTimeoutError(
            f"no reply within {timeout:g}s from {', '.join(waiting)} for {len(pending)} request(s) "
            f"(e.g. {example}): is the shard running, and does SHIPYARD_PS_SECRET match? "
            "(a shard drops messages whose MAC does not verify)"
        )

    def _deliver(self, r: _Req, msg: Message) -> None:
        h = msg.header
        if h.shard != r.shard and r.header.msg_type != MsgType.HELLO:  # hello() says it better
            raise RemoteError(
                f"reply claims shard {h.shard}, came from shard {r.shard}", shard=r.shard
            )
        if r.header.msg_type == MsgType.HELLO:
            self._peers[r.shard] = h.session  # every later request to it names this session
        if h.msg_type == MsgType.ERROR:
            body = msg.json() or {}
            raise remote_error(
                str(body.get("code", "internal")),
                str(body.get("message", "")),
                shard=r.shard,
                key=r.label or None,
            )
        r.on_reply(msg)


def json_key(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
