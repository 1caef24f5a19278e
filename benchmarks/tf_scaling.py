"""images/s of the tutorials' CIFAR-10 CNN on 1, 2 and 3 instances, parameter_server vs
multi_worker_mirrored_strategy, each worker pinned to one thread.

    .venv/bin/python benchmarks/tf_scaling.py [--instances 1 2 3] [--steps 60]

Data: random CIFAR-shaped batches made in the script (throughput only; nothing is read).
parameter_server: ParameterServerStrategy + tf_keras model.fit, N workers (one per
instance) -- asynchronous, images/s = steps x batch / time; one instance runs plainly (as
SageMaker does), which is the baseline. multi_worker_mirrored: Keras 3 model.fit (with
shipyard's fix for keras-team/keras#20585), global batch = N x batch, each worker computing
``batch`` of it. Timing excludes the first epoch (tracing, connections).
Prints a table and the scaling ratio img/s(N) / img/s(1) for each distribution.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap

TRAIN = textwrap.dedent("""
    import argparse, json, os, time
    import numpy as np
    p = argparse.ArgumentParser()
    p.add_argument("--mode"); p.add_argument("--steps", type=int); p.add_argument("--batch", type=int)
    p.add_argument("--model_dir", default=None)
    a = p.parse_args()
    if a.mode == "ps":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    def cnn(k):
        return k.Sequential([k.Input((32, 32, 3)),
            k.layers.Conv2D(32, 3, padding="same", activation="relu"), k.layers.Conv2D(32, 3, activation="relu"),
            k.layers.MaxPooling2D(), k.layers.Dropout(0.25),
            k.layers.Conv2D(64, 3, padding="same", activation="relu"), k.layers.Conv2D(64, 3, activation="relu"),
            k.layers.MaxPooling2D(), k.layers.Dropout(0.25), k.layers.Flatten(),
            k.layers.Dense(512, activation="relu"), k.layers.Dropout(0.5), k.layers.Dense(10, activation="softmax")])
    def data(batch):
        x = tf.random.uniform((batch, 32, 32, 3)); y = tf.random.uniform((batch,), 0, 10, tf.int64)
        return tf.data.Dataset.from_tensors((x, y)).repeat()
    times = []
    def timer(k):  # epoch times, with the callback class of the Keras in use
        class T(k.callbacks.Callback):
            def on_epoch_begin(self, e, logs=None): self.t = time.perf_counter()
            def on_epoch_end(self, e, logs=None): times.append(time.perf_counter() - self.t)
        return T()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if a.mode == "ps":
        multi = bool(resolver.cluster_spec().jobs)
        strategy = tf.distribute.ParameterServerStrategy(resolver) if multi else tf.distribute.get_strategy()
        with strategy.scope():
            model = cnn(tf.keras)
            model.compile(tf.keras.optimizers.legacy.SGD(0.01), "sparse_categorical_crossentropy", steps_per_execution=5)
        src = tf.keras.utils.experimental.DatasetCreator(lambda ctx: data(a.batch)) if multi else data(a.batch)
        global_batch, callback = a.batch, timer(tf.keras)  # async: a step is one worker's batch
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        import keras
        global_batch = a.batch * strategy.num_replicas_in_sync
        with strategy.scope():
            model = cnn(keras)
            model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")  # 1 step per call: see keras_compat
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        src, callback = data(global_batch).with_options(options), timer(keras)
    model.fit(src, epochs=3, steps_per_epoch=a.steps, verbose=0, callbacks=[callback])
    rate = 2 * a.steps * global_batch / sum(times[1:])
    print(f"images_per_sec={rate:.1f}")
""")


def run(mode: str, instances: int, steps: int, batch: int, src: str) -> float:
    import shipyard

    dist = (
        {"parameter_server": {"enabled": True}}
        if mode == "ps"
        else {"multi_worker_mirrored_strategy": {"enabled": True}}
    )
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=src,
        instance_count=instances,
        instance_type="local",
        distribution=dist,
        hyperparameters={"mode": mode, "steps": steps, "batch": batch},
        environment={
            "SHIPYARD_TF_INTRA_OP_THREADS": "1",
            "SHIPYARD_TF_INTER_OP_THREADS": "2",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        },
    )
    est.fit(logs=False)
    job = est.latest_training_job.describe()
    with open(os.path.join(job["Shipyard"]["JobDir"], "logs", "algo-1.log")) as fh:
        log = fh.read()
    return float(log.split("images_per_sec=")[1].split()[0])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("SHIPYARD_HOME", tempfile.mkdtemp(prefix="tf-scaling-"))
    src = tempfile.mkdtemp(prefix="tf-scaling-src-")
    with open(os.path.join(src, "train.py"), "w") as fh:
        fh.write(TRAIN)
    results: dict[tuple[str, int], float] = {}
    for mode in ("ps", "mwms"):
        for n in args.instances:
            rates = [run(mode, n, args.steps, args.batch, src) for _ in range(args.repeats)]
            results[mode, n] = statistics.median(rates)
            print(f"{mode} x{n}: {results[mode, n]:.1f} img/s", flush=True)
    print("\n| distribution | instances | img/s (median) | vs 1 instance |\n|---|---|---|---|")
    for (mode, n), rate in results.items():
        base = results.get((mode, args.instances[0]))
        print(f"| {mode} | {n} | {rate:.1f} | {rate / base:.2f}x |" if base else "")
    from _result import result

    result("tf_scaling", **{f"{mode}_x{n}_ips": rate for (mode, n), rate in results.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
