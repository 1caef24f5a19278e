"""A TF1 graph-mode script written for SageMaker's data-parallel library, in the shape of its
``tf.estimator`` era: ``DistributedOptimizer`` around a ``tf.compat.v1.train`` optimizer and
``BroadcastGlobalVariablesHook`` in a ``MonitoredTrainingSession``. Each rank starts from its
own random weights (the hook must fix that), trains on its own rows, and saves its final
weights and losses so the test can check every rank agrees."""

import json
import os

import numpy as np
import smdistributed.dataparallel.tensorflow as dist
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
dist.init()

rng = np.random.default_rng(0)
X = rng.normal(size=(128, 4)).astype("float32")
Y = (X @ rng.normal(size=(4, 1))).astype("float32")
shard = np.array_split(np.arange(128), dist.size())[dist.rank()]

tf.compat.v1.set_random_seed(100 + dist.rank())  # every rank its own initial weights
x = tf.compat.v1.placeholder(tf.float32, (None, 4))
y = tf.compat.v1.placeholder(tf.float32, (None, 1))
w = tf.compat.v1.get_variable("w", (4, 1), initializer=tf.compat.v1.random_normal_initializer())
b = tf.compat.v1.get_variable("b", (1,), initializer=tf.compat.v1.random_normal_initializer())
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
opt = dist.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.05))
step = tf.compat.v1.train.get_or_create_global_step()
train_op = opt.minimize(loss, global_step=step)

hooks = [dist.BroadcastGlobalVariablesHook(root_rank=0)]
losses, first = [], None
with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
    first = sess.run([w, b])  # after the hook: rank 0's initial weights everywhere
    for i in range(40):
        rows = shard[(i * 8) % len(shard) :][:8]
        _, value = sess.run([train_op, loss], {x: X[rows], y: Y[rows]})
        losses.append(float(value))
    final = sess.run([w, b])

out = os.environ["SM_MODEL_DIR"]
with open(os.path.join(out, f"tf1-rank-{dist.rank()}.json"), "w") as fh:
    json.dump(
        {
            "rank": dist.rank(),
            "size": dist.size(),
            "first": [a.tolist() for a in first],
            "final": [a.tolist() for a in final],
            "losses": losses,
        },
        fh,
    )
dist.shutdown()
