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

Where the parts live (one seam each; PSClient is the mixins put together)::

    client.py           PSClient: configuration, lifecycle (hello, heartbeats, close),
                        registration, control (set_lr, stats, checkpoint, finish)
    client_data.py      the data path: push / pull / push_pull / split phase, buckets
    client_requests.py  requests: headers (session, step), tensor and JSON requests,
                        small tensors grouped into PUSH_PULL_MANY
    client_exchange.py  the exchange: send all, collect replies as they come, verify,
                        deliver, map error replies and timeouts
    transport.py        the network seam (TCP sockets, or in-process shards)

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from shipyard import settings
from shipyard.errors import SettingError

from . import wire
from .client_data import BUCKET_BYTES, DataPath
from .client_exchange import PARALLEL_DECODE_MIN, Exchange
from .client_requests import GROUP_MAX_BYTES, GROUP_MAX_COUNT, Requests, _Req
from .errors import (
    PSConfigError,
    PSError,
    UnknownKeyError,
)
from .optimizers import make_optimizer
from .placement import (
    DEFAULT_CHUNK_BYTES,
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
# the sizes are re-exported: the framework adapters size their buckets with them
__all__ = [
    "BUCKET_BYTES",
    "ENDPOINTS_ENV",
    "GROUP_MAX_BYTES",
    "GROUP_MAX_COUNT",
    "HEARTBEAT_ENV",
    "PARALLEL_DECODE_MIN",
    "POLICY_ENV",
    "RANK_ENV",
    "REPORT_ENV",
    "TIMEOUT_ENV",
    "PSClient",
    "endpoints_from_env",
]

ArrayLike = Any


def endpoints_from_env() -> list[str]:
    value = settings.get(ENDPOINTS_ENV) or ""
    eps = [e.strip() for e in value.split(",") if e.strip()]
    if not eps:
        raise PSConfigError(
            f"no shard endpoints: pass endpoints=[...] or set {ENDPOINTS_ENV}="
            "'tcp://host:port,tcp://host:port' (shard 0 first)"
        )
    return eps


_T = TypeVar("_T")


def _setting(read: Callable[[str], _T], name: str) -> _T:
    """A setting read for the client: a bad value is a PSConfigError, as every bad option of
    shipyard.ps is (the message still names the variable and what it accepts)."""
    try:
        return read(name)
    except SettingError as err:
        raise PSConfigError(str(err)) from None


class PSClient(DataPath, Exchange, Requests):
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
            worker_id = _setting(settings.optional_integer, RANK_ENV) or 0
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
        self.timeout = timeout if timeout is not None else _setting(settings.number, TIMEOUT_ENV)
        self._factory = transport_factory
        self.transport: Transport = transport_factory()
        self.transport.sink = self._sink  # values land in the caller's arrays (client_data)
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
            heartbeat_interval
            if heartbeat_interval is not None
            else _setting(settings.number, HEARTBEAT_ENV)
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
        report_path = settings.get(REPORT_ENV)
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
        policy = policy or settings.get(POLICY_ENV) or "auto"
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


def json_key(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
