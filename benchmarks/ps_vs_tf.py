"""Images/s of the tutorials' CNN: shipyard.ps (Keras 3) vs TensorFlow's ParameterServerStrategy.

Goal (issue #4): 2 workers + 2 parameter servers, each worker pinned to one thread,
shipyard.ps at least as fast as TF's ParameterServerStrategy (ratio >= 1.0), both
measured in the same run.

* tf:       tf_keras ``model.fit`` under ``tf.distribute.ParameterServerStrategy``: a
            coordinator process and four ``tf.distribute.Server`` processes (2 ps, 2
            workers). The coordinator dispatches steps to both workers (the worker
            servers get a ConfigProto with 1 intra-op thread, the pool their remote
            functions compute on, and 2 inter-op threads: with 1 they deadlock);
            images/s = steps x batch /
            time of a timed ``fit`` after a warm-up ``fit``.
* shipyard: two ``python -m shipyard.ps.server`` shards and two worker processes, each
            a Keras 3 ``model.fit`` with ``shipyard.ps.keras.DistributedOptimizer``
            (1 intra-op and 1 inter-op thread); after warm-up steps both start
            their timed steps together; images/s = all their images / the time from
            the first timed step's start to the last one's end.

Same network (conv32-conv32-pool-conv64-conv64-pool-dense512-dense10 with dropout,
CIFAR-10 shaped 32x32x3 inputs, 1.25 M parameters), same synthetic data, same batch
size, SGD with momentum on the servers in both. The two modes alternate ``--repeats``
times so machine noise hits both; medians are reported. Process start-up (TensorFlow
imports) is not timed.

Run:  python benchmarks/ps_vs_tf.py [--repeats 3] [--steps 60] [--batch 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SECRET = "ps-vs-tf-benchmark"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def data(n: int = 1024):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


def cnn(keras):
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            L.Conv2D(32, 3, padding="same", activation="relu"),
            L.Conv2D(32, 3, activation="relu"),
            L.MaxPooling2D(),
            L.Dropout(0.25),
            L.Conv2D(64, 3, padding="same", activation="relu"),
            L.Conv2D(64, 3, activation="relu"),
            L.MaxPooling2D(),
            L.Dropout(0.25),
            L.Flatten(),
            L.Dense(512, activation="relu"),
            L.Dropout(0.5),
            L.Dense(10, activation="softmax"),
        ]
    )


def one_thread(tf) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


# ------------------------------------------------------------------------------- roles
def tf_server(cluster: dict, job: str, index: int) -> None:
    import tensorflow as tf

    config = None
    if job == "worker":  # a server runs remote functions with its ConfigProto's thread pools
        one_thread(tf)
        # one compute (intra-op) thread; two inter-op threads, since with one a worker server
        # deadlocks (a remote function's receive blocks the only scheduling thread)
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=1, inter_op_parallelism_threads=2
        )
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=job,
        task_index=index,
        protocol="grpc",
        config=config,
        start=True,
    )
    server.join()


def tf_coordinator(cluster: dict, steps: int, batch: int) -> dict:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": cluster, "task": {"type": "chief", "index": 0}}
    )
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    x, y = data()

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return ds.batch(ctx.get_per_replica_batch_size(batch)).prefetch(2)

    with strategy.scope():
        model = cnn(tf.keras)
        model.compile(
            optimizer=tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
        )
    creator = tf.keras.utils.experimental.DatasetCreator(dataset_fn)
    model.fit(creator, epochs=1, steps_per_epoch=10, verbose=0)  # warm-up: trace, place, connect
    t0 = time.perf_counter()
    model.fit(creator, epochs=1, steps_per_epoch=2 * steps, verbose=0)
    dt = time.perf_counter() - t0
    return {"images_per_s": 2 * steps * batch / dt, "seconds": dt}


def barrier(directory: str, rank: int, size: int, timeout: float = 600.0) -> None:
    """Both workers start their timed steps together (their TensorFlow imports and
    warm-ups must not overlap the other's timed phase)."""
    Path(directory, f"ready-{rank}").touch()
    deadline = time.monotonic() + timeout
    while sum(Path(directory, f"ready-{r}").exists() for r in range(size)) < size:
        if time.monotonic() > deadline:
            raise TimeoutError("the other worker never became ready")
        time.sleep(0.01)


def shipyard_worker(rank: int, steps: int, batch: int, sync_dir: str) -> dict:
    import tensorflow as tf

    one_thread(tf)
    import keras

    import shipyard.ps.keras as ps_keras

    x, y = data()
    keras.utils.set_random_seed(rank)
    model = cnn(keras)
    model.compile(
        optimizer=ps_keras.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
        loss="sparse_categorical_crossentropy",
    )
    times: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            times.append(time.perf_counter())

    model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=10, verbose=0)  # warm-up
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch).prefetch(2)
    model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0)  # trace fit's Dataset path too
    barrier(sync_dir, rank, 2)
    t0 = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[Clock()])
    dt = times[-1] - t0
    return {
        "images_per_s": steps * batch / dt,
        "seconds": dt,
        "start": time.time() - (time.perf_counter() - t0),
        "end": time.time() - (time.perf_counter() - times[-1]),
    }


# ------------------------------------------------------------------------------- driver
def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def spawn(role: list[str], env: dict | None = None, out=subprocess.DEVNULL) -> subprocess.Popen:
    full = dict(os.environ, **QUIET, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), full.get("PYTHONPATH", "")) if p
    )
    return subprocess.Popen(
        [sys.executable, __file__, "--role", *role], env=full, stdout=out, stderr=subprocess.DEVNULL
    )


def result_of(proc: subprocess.Popen, timeout: float) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args[3:]} exited with {proc.returncode}")
    return json.loads(out.decode().strip().splitlines()[-1])


def run_tf(steps: int, batch: int) -> float:
    ports = free_ports(4)
    cluster = {
        "ps": [f"127.0.0.1:{p}" for p in ports[:2]],
        "worker": [f"127.0.0.1:{p}" for p in ports[2:]],
    }
    cluster_chief = dict(cluster, chief=[f"127.0.0.1:{free_ports(1)[0]}"])
    servers = [
        spawn(["tf-server", json.dumps(cluster_chief), job, str(i)])
        for job in ("ps", "worker")
        for i in range(2)
    ]
    try:
        coord = spawn(
            ["tf-coordinator", json.dumps(cluster_chief), str(steps), str(batch)],
            out=subprocess.PIPE,
        )
        return result_of(coord, 600)["images_per_s"]
    finally:
        for s in servers:
            s.kill()
            s.wait()


def run_shipyard(steps: int, batch: int) -> float:
    from shipyard.ps.launch import start_shards, stop_shards

    with tempfile.TemporaryDirectory(prefix="ps-vs-tf-") as tmp:
        shards = start_shards(2, SECRET, run_dir=tmp, checkpoint_interval=0)
        try:
            env = {
                "SHIPYARD_PS_SECRET": SECRET,
                "SHIPYARD_PS_ENDPOINTS": ",".join(s.endpoint for s in shards),
                "SHIPYARD_PS_HEARTBEAT": "1",
            }
            workers = [
                spawn(
                    ["shipyard-worker", str(r), str(steps), str(batch), tmp],
                    dict(env, SHIPYARD_PS_RANK=str(r)),
                    out=subprocess.PIPE,
                )
                for r in range(2)
            ]
            results = [result_of(w, 600) for w in workers]
        finally:
            stop_shards(shards)
    # both ran their timed steps together: all images over the union of the two windows
    return 2 * steps * batch / (max(r["end"] for r in results) - min(r["start"] for r in results))


def role_main(role: list[str]) -> None:
    kind = role[0]
    if kind == "tf-server":
        tf_server(json.loads(role[1]), role[2], int(role[3]))
    elif kind == "tf-coordinator":
        print(
            json.dumps(tf_coordinator(json.loads(role[1]), int(role[2]), int(role[3]))), flush=True
        )
    elif kind == "shipyard-worker":
        print(
            json.dumps(shipyard_worker(int(role[1]), int(role[2]), int(role[3]), role[4])),
            flush=True,
        )
        os._exit(0)  # the client's atexit leave is not needed here; exit at once


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="timed steps per worker")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.role:
        role_main(args.role)
        return 0
    rates: dict[str, list[float]] = {"shipyard": [], "tf": []}
    for i in range(args.repeats):
        rates["shipyard"].append(run_shipyard(args.steps, args.batch))
        rates["tf"].append(run_tf(args.steps, args.batch))
        print(
            f"round {i + 1}: shipyard.ps {rates['shipyard'][-1]:.0f} images/s | "
            f"tf ParameterServerStrategy {rates['tf'][-1]:.0f} images/s",
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["shipyard"] / med["tf"]
    print(
        f"median: shipyard.ps {med['shipyard']:.0f} images/s, TF PSS {med['tf']:.0f} images/s, "
        f"ratio {ratio:.2f} (goal >= 1.3)"
    )
    from _result import result

    result("ps_vs_tf", shipyard_ips=med["shipyard"], tf_ips=med["tf"], ratio=ratio)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rates": rates,
                    "median": med,
                    "ratio": ratio,
                    "steps": args.steps,
                    "batch": args.batch,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
