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

Where the parts live (objects with one job each; what they share is one
``ClientState``, handed to each in its constructor)::

    client.py           PSClient: configuration, lifecycle (hello, close),
                        registration, control (set_lr, stats, checkpoint, finish);
                        the data calls go to its DataPath
    client_state.py     ClientState: worker id, signer, step, shard sessions, keys
    client_data.py      DataPath: push / pull / push_pull / split phase, buckets
    client_requests.py  RequestBuilder: headers (session, step), tensor and JSON
                        requests, small tensors grouped into PUSH_PULL_MANY
    client_exchange.py  Exchange: send all, collect replies as they come, verify,
                        deliver, map error replies and timeouts
    client_heartbeat.py Heartbeats: the thread that says this worker is alive
    transport.py        the network seam (TCP sockets, or in-process shards)

Errors: bad arguments raise ``PSConfigError`` / ``ShapeMismatchError`` /
``UnknownKeyError`` before anything is sent; a shard's error reply raises the
matching ``RemoteError``; no reply in ``timeout`` seconds raises ``PSTimeoutError``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from shipyard import settings
from shipyard.errors import SettingError
from shipyard.runtime import steptiming

from . import wire
from .client_data import BUCKET_BYTES, DataPath
from .client_exchange import PARALLEL_DECODE_MIN, Exchange
from .client_heartbeat import Heartbeats
from .client_requests import GROUP_MAX_BYTES, GROUP_MAX_COUNT, RequestBuilder
from .client_state import ClientState
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
from .wire import Message, MsgType

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

    Put together from parts that share one ``ClientState``: ``RequestBuilder``
    (client_requests.py), ``Exchange`` (client_exchange.py), ``DataPath``
    (client_data.py) and ``Heartbeats`` (client_heartbeat.py); this class is the
    lifecycle, registration and control, and hands the data calls to the data path.
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
        secret_bytes = wire.secret_from_env(secret)
        self.signer = wire.Signer(secret_bytes, mac)
        self.transport: Transport = transport_factory()
        self.num_shards = self.transport.num_shards
        if not self.endpoints:
            self.endpoints = [f"shard-{i}" for i in range(self.num_shards)]
        self._state = ClientState(
            worker_id=worker_id,
            signer=self.signer,
            endpoints=self.endpoints,
            timeout=timeout if timeout is not None else _setting(settings.number, TIMEOUT_ENV),
            peers=[0] * self.num_shards,  # each shard's session, learned in hello()
        )
        self._requests = RequestBuilder(self._state, self._learn_sessions)
        self._exchange = Exchange(self._state, self.transport, self._learn_sessions)
        self._data = DataPath(self._state, self._requests, self._exchange)
        # inside a job: each step's time and its push/pull time, for describe and the planner
        timing_path = steptiming.path_beside(settings.get("SHIPYARD_REPORT_PATH"))
        if timing_path:
            self._data.recorder = steptiming.StepRecorder(
                timing_path, "shipyard.ps client", settings.get("SHIPYARD_CURRENT_HOST")
            )
        self.shard_info: list[dict[str, Any]] = []
        self.report: PlacementReport | None = None
        self._servers_down = False
        hb = (
            heartbeat_interval
            if heartbeat_interval is not None
            else _setting(settings.number, HEARTBEAT_ENV)
        )
        # its own session: its messages travel on their own connections, so their
        # numbers must not interleave with the requests' (each session is in order)
        self._heartbeats = Heartbeats(
            self._state, lambda: wire.Signer(secret_bytes, mac), transport_factory, hb
        )
        if connect:
            try:
                self.hello()
                if hb and hb > 0:
                    self._heartbeats.start()
            except BaseException:
                self.close(leave=False)
                raise

    # what the parts share, as attributes of the client ------------------------------
    @property
    def step(self) -> int:
        """This worker's step: sent with every request, advanced by each push_pull."""
        return self._state.step

    @step.setter
    def step(self, value: int) -> None:
        self._state.step = value

    @property
    def timeout(self) -> float:
        """Seconds without progress before a call raises PSTimeoutError."""
        return self._state.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._state.timeout = value

    # the data path (client_data.DataPath) ------------------------------------------
    @property
    def keys(self) -> list[str]:
        """The registered parameter names, in registration order."""
        return self._data.keys

    def placement(self, name: str) -> KeyPlacement:
        """Where ``name``'s chunks live; UnknownKeyError if it was not registered."""
        return self._data.placement(name)

    def push(self, key: str, grad: ArrayLike) -> None:
        """Send one gradient for the current ``step``; returns once every shard accepted it."""
        self._data.push_all({key: grad})

    def push_all(self, grads: Mapping[str, ArrayLike]) -> None:
        """Send several gradients at once (pipelined over all shards)."""
        self._data.push_all(grads)

    def pull(self, key: str, out: np.ndarray | None = None) -> np.ndarray:
        """Current value of ``key`` (waits as the consistency mode requires)."""
        return self._data.pull(key, out)

    def pull_all(
        self, keys: Iterable[str] | None = None, outs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Current values of ``keys`` (default: all registered), pipelined."""
        return self._data.pull_all(keys, outs)

    def push_pull(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Push every gradient and get back the updated values (``DataPath.push_pull``)."""
        return self._data.push_pull(grads, outs)

    def push_pull_begin(
        self, grads: Mapping[str, ArrayLike], outs: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Split-phase push_pull, part 1 (``DataPath.push_pull_begin``)."""
        self._data.push_pull_begin(grads, outs)

    def push_pull_end(self) -> dict[str, np.ndarray]:
        """Split-phase push_pull, part 2: wait for every reply since the last end."""
        return self._data.push_pull_end()

    def next_step(self) -> int:
        """Advance this worker's step counter (after a manual push/pull sequence)."""
        return self._data.next_step()

    # lifecycle -----------------------------------------------------------------------
    def hello(self) -> list[dict[str, Any]]:
        """Join every shard; checks shard order and sets ``step`` to where this worker resumes."""
        body = {"worker": self.worker_id, "pid": os.getpid()}
        infos = self._ask_all(MsgType.HELLO, body, "hello")
        for i, info in enumerate(infos):
            assert info is not None
            if info.get("shard") != i or info.get("num_shards") != self.num_shards:
                raise PSConfigError(
                    f"endpoint {self.endpoints[i]} is shard {info.get('shard')} of {info.get('num_shards')}, "
                    f"expected shard {i} of {self.num_shards}: list endpoints in shard order"
                )
        self.shard_info = [dict(x) for x in infos if x is not None]
        self._state.many = all(
            "push_pull_many" in (x.get("features") or ()) for x in self.shard_info
        )
        modes = {json_key(x.get("consistency")) for x in self.shard_info}
        if len(modes) > 1:
            raise PSConfigError(f"shards disagree on consistency: {sorted(modes)}")
        self.step = max((int(x.get("step", 0)) for x in self.shard_info), default=0)
        return self.shard_info

    def _learn_sessions(self, timeout: float | None = None) -> None:
        """Say HELLO to the shards whose session this client does not know yet (a client
        made with ``connect=False``): every other request must name it (replay guard)."""
        missing = [i for i in range(self.num_shards) if not self._state.peers[i]]
        if missing:
            body = {"worker": self.worker_id, "pid": os.getpid()}
            self._exchange.exchange(
                [self._requests.json(i, MsgType.HELLO, body, None, "hello") for i in missing],
                timeout,
            )

    def _ask_all(
        self, mtype: MsgType, body: Any, label: str, timeout: float | None = None
    ) -> list[Any]:
        """Send one JSON request to every shard; returns each shard's JSON reply, in order."""
        out: list[Any] = [None] * self.num_shards

        def keep(i: int) -> Callable[[Message], None]:
            def cb(m: Message) -> None:
                out[i] = m.json()

            return cb

        self._exchange.exchange(
            [self._requests.json(i, mtype, body, keep(i), label) for i in range(self.num_shards)],
            timeout,
        )
        return out

    def close(self, leave: bool = True) -> None:
        """Stop heartbeats, tell shards this worker leaves (``leave=True``), close sockets.

        Rank 0 first writes the report to ``$SHIPYARD_PS_REPORT`` when that is set
        (what ``shipyard describe`` shows), best effort."""
        if self._exchange.closed:
            return
        report_path = settings.get(REPORT_ENV)
        if report_path and self.worker_id == 0 and leave and not self._servers_down:
            try:
                self.write_report(report_path, timeout=min(self.timeout, 5.0))
            except (PSError, OSError) as exc:
                log.warning(
                    "could not write the parameter-server report to %s: %s", report_path, exc
                )
        self._heartbeats.stop()
        if leave and not self._servers_down:
            try:  # short: at the end of a job the shards may already be gone
                self._ask_all(MsgType.LEAVE, {}, "leave", timeout=min(self.timeout, 2.0))
            except PSError as exc:
                log.warning("leave not acknowledged: %s", exc)
        self._exchange.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        items: list[TensorSpec | tuple[str, ArrayLike]] = (
            list(params.items()) if isinstance(params, Mapping) else list(params)
        )
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
        self._state.keys = {k.spec.name: k for k in self.report.chosen.keys}
        group_cfg = dict(optimizers) if optimizers is not None else {"default": optimizer}
        group_of = dict(groups or {})
        for name, g in group_of.items():
            if name not in self._state.keys:
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
                reqs.append(
                    self._requests.json(shard, MsgType.REGISTER, body, None, f"register {g}")
                )
        self._exchange.exchange(reqs)
        if init:
            missing = [n for n, v in values.items() if v is None]
            if missing:
                raise PSConfigError(f"init needs values; no array given for {missing[:3]}")
            given_values = {n: v for n, v in values.items() if v is not None}
            self._exchange.exchange(self._data.send_reqs(given_values, MsgType.INIT))
        return self.pull_all()

    # control ----------------------------------------------------------------------
    def set_lr(self, lr: float, group: str | None = None) -> None:
        """Change the server-side learning rate on every shard (all groups, or one)."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0 or lr != lr:
            raise PSConfigError(f"lr must be a number >= 0, got {lr!r}")
        body: dict[str, Any] = {"lr": float(lr)}
        if group is not None:
            body["group"] = group
        self._ask_all(MsgType.SET_LR, body, "set_lr")

    def shard_stats(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Each shard's raw STATS reply."""
        self._learn_sessions(timeout)
        return self._ask_all(MsgType.STATS, {}, "stats", timeout)

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
        return [(r or {}).get("path") for r in self._ask_all(MsgType.CHECKPOINT, {}, "checkpoint")]

    def finish(
        self, exit_code: int, error: str = "", timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Tell every shard this worker's process ended (what the runner's worker wrapper
        sends) and wait until every worker of the job has ended; returns each shard's
        final answer: ``{"finished": {rank: outcome}, "stats": ..., "placement": ...}``."""
        self._learn_sessions(timeout)
        body = {"exit_code": int(exit_code), "error": error[-2000:]}
        out = self._ask_all(MsgType.DONE, body, "done", timeout)
        self._servers_down = True  # they stop right after answering
        return out

    def shutdown_servers(self) -> None:
        """Tell every shard to write its final checkpoint and exit."""
        self._ask_all(MsgType.SHUTDOWN, {}, "shutdown")
        self._servers_down = True


def json_key(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
