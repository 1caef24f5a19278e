"""Keras on 2 ranks gives the weights one process gets on the combined batch: Keras 3 ``fit`` with
DistributedOptimizer + callbacks, a DistributedGradientTape loop, and tf_keras (legacy Keras)."""

from __future__ import annotations

import pytest
from tests.lazy import needs

# a test that starts its flavour's shared job waits for both scripts (hang guard)
pytestmark = [needs("tensorflow"), pytest.mark.timeout(400)]

COMMON = r"""
import os
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
import shipyard.horovod.tensorflow as hvdtf
import shipyard.horovod.tensorflow.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(0)
X = rng.normal(size=(64, 6)).astype("float32")
Y = rng.integers(0, 3, size=64)
per = 64 // n          # rank r owns rows [r*per, (r+1)*per)
B = per // 2           # local batch; global batch = n * B


def global_order():
    # the rows one process sees, batch by batch, to match what all ranks see together
    idx = [np.concatenate([np.arange(k * per + s * B, k * per + (s + 1) * B) for k in range(n)]) for s in range(2)]
    return np.concatenate(idx)


def maxdiff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a.get_weights(), b.get_weights()))
"""

KERAS3 = (
    COMMON
    + r"""
import keras
assert keras.__version__.startswith("3"), keras.__version__
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])


class Capture(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.logs = dict(logs)


# fit: every rank starts from different weights; BroadcastGlobalVariablesCallback fixes that
model = make(100 + r)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss=loss)
cap = Capture()
xs, ys = X[r * per:(r + 1) * per], Y[r * per:(r + 1) * per]
model.fit(xs, ys, batch_size=B, epochs=3, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(), cap])
ref = make(100)
ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
o = global_order()
ref.fit(X[o], Y[o], batch_size=n * B, epochs=3, shuffle=False, verbose=0)
d = maxdiff(model, ref)
assert d < 1e-5, d
logs = hvd.allgather_object(cap.logs["loss"])
assert logs == [logs[0]] * n, logs      # metrics averaged: identical everywhere
print(f"FIT {r} {d:.2e}", flush=True)

# backward_passes_per_step=2 maps onto Keras' gradient accumulation; reduced once per 2 passes
model = make(5)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2), loss=loss)
model.fit(xs, ys, batch_size=B // 2, epochs=1, shuffle=False, verbose=0)
ref = make(5)
ref.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
ref.fit(X[o], Y[o], batch_size=n * B, epochs=1, shuffle=False, verbose=0)
d = maxdiff(model, ref)
assert d < 1e-5, d
print(f"BPPS {r} {d:.2e}", flush=True)

# custom loop with DistributedGradientTape, inside tf.function (graph: py_function path)
m, mref = make(7 + r), make(7)
hvdtf.broadcast_variables(m.variables, root_rank=0)
opt, opt_ref = keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01)


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        l = loss(y, m(x))
    tape = hvdtf.DistributedGradientTape(tape)
    grads = tape.gradient(l, m.trainable_variables)
    opt.apply_gradients(zip(grads, m.trainable_variables))


for s in range(3):
    step(xs, ys)
    with tf.GradientTape() as tape:
        l = loss(Y, mref(X))
    opt_ref.apply_gradients(zip(tape.gradient(l, mref.trainable_variables), mref.trainable_variables))
d = maxdiff(m, mref)
assert d < 1e-5, d
print(f"TAPE {r} {d:.2e}", flush=True)

# TF ops, eager
t = tf.constant([1.0, 2.0]) * (r + 1)
assert hvdtf.allreduce(t, op=hvdtf.Sum).numpy().tolist() == [n * (n + 1) / 2, n * (n + 1)]
assert hvdtf.allgather(tf.fill([r + 1], r)).numpy().tolist() == [k for k in range(n) for _ in range(k + 1)]
assert hvdtf.broadcast(t, 1).numpy().tolist() == [2.0, 4.0]
x = tf.Variable([1.0, 1.0])
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvdtf.allreduce(x * (r + 1), op=hvdtf.Sum))
assert tape.gradient(y, x).numpy().tolist() == [n * (r + 1.0)] * 2
v = tf.Variable(tf.ones([r + 1, 2]))
w = tf.reshape(tf.range(n * (n + 1), dtype=tf.float32), [-1, 2])  # same on every rank
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvdtf.allgather(v) * w)
start = r * (r + 1) // 2  # rows before this rank's
assert tape.gradient(y, v).numpy().tolist() == (n * w[start:start + r + 1]).numpy().tolist()

# the LR warmup callback ramps the learning rate up to initial_lr over its epochs
model = make(3)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=loss)
model.fit(xs, ys, batch_size=B, epochs=2, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.05, warmup_epochs=2)])
assert abs(float(model.optimizer.learning_rate.numpy()) - 0.05) < 1e-7

# a model trained with DistributedOptimizer saves and loads with plain Keras (serving) and hvd.load_model
model.save(f"model{r}.keras")
assert type(keras.models.load_model(f"model{r}.keras").optimizer) is keras.optimizers.SGD
assert hvd.load_model(f"model{r}.keras").optimizer._hvd_settings["op"] == hvd.Average
print(f"OK {r}", flush=True)
"""
)

LEGACY = (
    r"""
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
"""
    + COMMON
    + r"""
keras = tf.keras
assert keras.__name__.startswith("tf_keras"), keras.__name__
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(6,)), keras.layers.Dense(3)])


xs, ys = X[r * per:(r + 1) * per], Y[r * per:(r + 1) * per]
o = global_order()
for opt_cls in (keras.optimizers.SGD, keras.optimizers.legacy.SGD):
    model = make(100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(opt_cls(0.1, momentum=0.9)), loss=loss)
    model.fit(xs, ys, batch_size=B, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])
    ref = make(100)
    ref.compile(optimizer=opt_cls(0.1, momentum=0.9), loss=loss)
    ref.fit(X[o], Y[o], batch_size=n * B, epochs=2, shuffle=False, verbose=0)
    d = maxdiff(model, ref)
    assert d < 1e-5, (opt_cls, d)
    print(f"LEGACY {r} {opt_cls.__module__} {d:.2e}", flush=True)
print(f"OK {r}", flush=True)
"""
)


def _check(res, tags):
    assert res.returncode == 0, f"stdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-5000:]}"
    for tag in tags:
        assert sorted({int(ln.split()[1]) for ln in res.lines(tag + " ")}) == [0, 1], (
            tag,
            res.stdout,
        )


def test_keras3_fit_and_gradient_tape_match_one_process(keras_runs):
    res = keras_runs["keras3"]
    _check(res, ["FIT", "BPPS", "TAPE", "OK"])


def test_tf_keras_legacy_fit_matches_one_process(keras_runs):
    res = keras_runs["tf_keras"]
    _check(res, ["LEGACY", "OK"])
    assert len(res.lines("LEGACY ")) == 4


# Issue 16 item 1: models built lazily (no input shape: no weights until the first batch), the
# way many public Horovod scripts write them. Horovod broadcasts after the first batch; at
# learning rate 0 every rank must then hold rank 0's weights. Eagerly built models too.
CALLBACK_SCRIPT = r"""
import os, sys
import numpy as np
flavour = sys.argv[1] if len(sys.argv) > 1 else os.environ["KERAS_FLAVOUR"]
if flavour == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
import shipyard.horovod.tensorflow.keras as hvd
keras = tf.keras
assert keras.__name__.startswith("tf_keras" if flavour == "tf_keras" else "keras"), keras.__name__

hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(r)
X = rng.normal(size=(32, 6)).astype("float32")
Y = rng.integers(0, 3, size=32)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make(lazy, seed):
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
    if lazy:
        return keras.Sequential(layers)
    return keras.Sequential([keras.Input((6,))] + layers)


class Capture(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.logs = dict(logs)


for lazy in (True, False):
    for lr in (0.0, 0.05):
        model = make(lazy, 100 + r)           # every rank starts from its own weights
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)),
                      loss=loss, metrics=["accuracy"])
        cap = Capture()
        cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
               hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1, steps_per_epoch=4),
               hvd.callbacks.LearningRateScheduleCallback(initial_lr=lr, multiplier=0.5, start_epoch=1,
                                                          staircase=False),
               cap]
        model.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=cbs)
        sums = [float(np.asarray(w).sum()) for w in model.get_weights()]
        every = hvd.allgather_object(sums)
        assert all(np.allclose(s, every[0], rtol=0, atol=1e-6) for s in every), (lazy, lr, every)
        logs = hvd.allgather_object({k: float(v) for k, v in cap.logs.items()})
        assert all(d == logs[0] for d in logs), (lazy, lr, logs)      # metrics averaged
        assert abs(logs[0]["lr"] - 0.5 * lr) < 1e-7, logs             # warmup, then the schedule
        print(f"SAME {r} lazy={lazy} lr={lr} kernel_sum={sums[0]:.4f}", flush=True)
print(f"OK {r}", flush=True)
"""


class KerasRuns:
    """One 2-rank job per Keras flavour, run when a test of that flavour first asks and
    shared by the tests of that flavour: the fit / tape script (KERAS3 or LEGACY), then
    CALLBACK_SCRIPT, in the same processes. Each rank imports TensorFlow and Keras once per
    flavour instead of once per test (~8 s of CPU a rank); the scripts' checks and prints
    are unchanged (each prints its own "OK r")."""

    FIRST = {"keras3": KERAS3, "tf_keras": LEGACY}

    def __init__(self, mpirun: str, tmp_path_factory) -> None:
        self.mpirun, self.tmp_path_factory = mpirun, tmp_path_factory
        self.done: dict = {}

    def __getitem__(self, flavour: str):
        from tests.integration.horovod.conftest import in_sequence, launch_mpi

        if flavour not in self.done:
            workdir = self.tmp_path_factory.mktemp(f"keras-{flavour}")
            script = in_sequence(workdir, self.FIRST[flavour], CALLBACK_SCRIPT)
            env = {"KERAS_FLAVOUR": flavour}
            self.done[flavour] = launch_mpi(self.mpirun, workdir, script, 2, env=env, timeout=330)
        return self.done[flavour]


@pytest.fixture(scope="module")
def keras_runs(mpirun, tmp_path_factory) -> KerasRuns:
    return KerasRuns(mpirun, tmp_path_factory)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_callbacks_leave_every_rank_identical_lazy_and_eager_models(keras_runs, flavour):
    res = keras_runs[flavour]
    _check(res, ["OK"])
    assert len(res.lines("OK ")) == 4, res.stdout  # both scripts ran to their end
    assert len(res.lines("SAME ")) == 8, res.stdout
