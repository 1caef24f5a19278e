"""shipyard.ps: a native, framework-agnostic parameter server (numpy buffers, plain TCP).

Why: PyTorch has no maintained parameter server and Keras 3 dropped
ParameterServerStrategy; SageMaker's ``parameter_server`` distribution still
needs one. This package brings asynchronous PS training back for any framework:
shards hold the parameters and run the optimizer, workers push gradients and
pull parameters, and everything that crosses the wire is counted and reported.

Modules (one job each)::

    errors.py       the typed error tree
    buffers.py      flat byte views of frames and arrays (no copies)
    header.py       the fixed message header: layout, message/dtype/MAC codes, Header
    integrity.py    the MACs (aes-gmac default, hmac-sha256, poly1305, blake3), Signer
    replay.py       ReplayGuard: each authenticated message accepted once
    wire.py         messages: encode/decode (no pickle, zero-copy); re-exports the above
    placement.py    round_robin | greedy_bytes | sliced | auto, and the report
    optimizers.py   SGD (momentum, nesterov), Adam, AdamW, Adagrad: torch's formulas
    consistency.py  async | bounded staleness | sync, worker liveness (pure)
    shard.py        parameters + optimizer state of one shard (no sockets)
    checkpoint.py   atomic .npz + JSON manifest checkpoints, resume
    stats.py        counters, traffic matrix, the JSON report schema
    shard_config.py ServerConfig: a shard's settings (its CLI flags)
    core.py         the shard's protocol state machine (frames in, frames out): data
                    requests checked in requests.py, replies made in replies.py,
                    control requests in commands.py, the job's end in ending.py
    stream.py       messages on a TCP stream: framing, non-blocking reader and writer
    transport.py    the client's transport seam: TCP sockets, or in-process
    server.py       the shard process (socket loop) and ``python -m shipyard.ps.server``
    options.py      the job's options (policy, consistency, counts), validated; no numpy
    launch.py       shard command lines, start/stop shard processes (runners, tests, benchmarks)
    client.py       PSClient, composed of client_*.py's objects over one ClientState
    worker.py       ``python -m shipyard.ps.worker -- CMD``: runs a worker, reports its end
    torch.py        PyTorch adapter: DistributedOptimizer (imports torch; nothing else here does)
    keras.py        Keras 3 adapter: DistributedOptimizer for model.fit (imports tensorflow)

In a job, ``distribution={'parameter_server': {'enabled': True, ...}}`` (PyTorch or
any framework; the TensorFlow estimator with ``'implementation': 'shipyard'``) runs
the native_ps runner (shipyard/agent/runners/native_ps.py): shards end by
themselves once every worker has ended; options are documented in options.py.

Configuration a runner sets
---------------------------
Shards (one process per instance by default; ``--num-shards`` is configurable)::

    SHIPYARD_PS_SECRET=<per-job random secret>            # required, same everywhere
    python -m shipyard.ps.server --bind tcp://0.0.0.0:PORT --shard-index I \\
        --num-shards N --checkpoint-dir /opt/ml/checkpoints \\
        [--consistency async|bounded|sync] [--max-staleness S] [--num-workers W] \\
        [--heartbeat-timeout 10] [--checkpoint-interval 60] [--max-message-bytes N] \\
        [--ready-file F] [--stats-file F] [--exit-with-parent]

    ``launch.shard_command(...)`` builds exactly this argv; SIGTERM or a SHUTDOWN
    message ends a shard after a final checkpoint (exit code 0).

Workers (the training script's environment)::

    SHIPYARD_PS_SECRET      same secret as the shards (required)
    SHIPYARD_PS_ENDPOINTS   comma-separated shard endpoints, shard 0 first (required)
    SHIPYARD_PS_RANK        this worker's id, 0..W-1 (default 0; rank 0 initializes)
    SHIPYARD_PS_TIMEOUT     seconds without any reply before PSTimeoutError (default 300)
    SHIPYARD_PS_HEARTBEAT   heartbeat interval in seconds (default 1; 0 disables)
    SHIPYARD_PS_REPORT      rank 0 writes the JSON report (stats.py schema) here on close
    SHIPYARD_PS_MAC         aes-gmac (default when `cryptography` is installed, as the
                            ps extra does) | poly1305 (also `cryptography`) |
                            hmac-sha256 (stdlib fallback) | blake3 (needs `blake3`);
                            shards accept any they have installed

PyTorch::

    import shipyard.ps.torch as ps_torch
    opt = ps_torch.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                        named_parameters=model.named_parameters())

Minimal use::

    from shipyard.ps import PSClient
    with PSClient() as ps:
        params = ps.register({"w": w0, "b": b0}, optimizer={"name": "sgd", "lr": 0.1})
        params = ps.push_pull({"w": gw, "b": gb})
        report = ps.stats()     # JSON: placement, shards, traffic matrix, staleness
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names -> the module that defines them. Imported lazily (PEP 562) so that
# ``shipyard.ps.options`` (what the control plane validates submissions with) does not
# drag numpy into every ``shipyard train``.
_EXPORTS = {
    "client": (
        "ENDPOINTS_ENV",
        "HEARTBEAT_ENV",
        "RANK_ENV",
        "REPORT_ENV",
        "TIMEOUT_ENV",
        "PSClient",
    ),
    "consistency": ("Consistency",),
    "core": ("ServerConfig", "ServerCore"),
    "errors": (
        "AuthenticationError",
        "CheckpointError",
        "PSConfigError",
        "PSError",
        "PSTimeoutError",
        "RemoteError",
        "ShapeMismatchError",
        "UnknownKeyError",
        "WireError",
    ),
    "optimizers": ("SGD", "Adagrad", "Adam", "AdamW", "make_optimizer"),
    "options": ("PSOptions",),
    "placement": ("PlacementReport", "TensorSpec", "place"),
    "stats": ("build_report",),
    "transport": ("LocalNetwork", "LocalTransport", "SocketTransport", "Transport"),
    "wire": ("SECRET_ENV",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'shipyard.ps' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
