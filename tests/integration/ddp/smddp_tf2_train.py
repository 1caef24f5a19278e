"""A TF2 custom training loop written for SageMaker's data-parallel library, in the shape of
its TF2 examples (first-batch broadcast of model and optimizer variables inside the
tf.function step, DistributedGradientTape, oob_allreduce of the loss). Each rank saves its
final weights and what it saw, so the test can check they all agree."""

import json
import os

import numpy as np
import smdistributed.dataparallel.tensorflow as dist
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

dist.init()

# each rank starts from its own random weights: broadcast_variables must fix that
tf.random.set_seed(100 + dist.rank())
rng = np.random.default_rng(0)
X = rng.normal(size=(256, 8)).astype("float32")
Y = (X @ rng.normal(size=(8, 1))).astype("float32")
shard = np.array_split(np.arange(256), dist.size())[dist.rank()]  # each rank its own rows
ds = tf.data.Dataset.from_tensor_slices((X[shard], Y[shard])).batch(16).repeat()

model = tf.keras.Sequential(
    [tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="tanh"), tf.keras.layers.Dense(1)]
)
loss_fn = tf.keras.losses.MeanSquaredError()
opt = tf.keras.optimizers.Adam(0.01 * dist.size())  # scale the learning rate, as the guide says


def optimizer_variables():
    variables = opt.variables
    return variables() if callable(variables) else variables  # Keras 2 or Keras 3


@tf.function
def training_step(x, y, first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = dist.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        dist.broadcast_variables(model.variables, root_rank=0)
        dist.broadcast_variables(optimizer_variables(), root_rank=0)
    return dist.oob_allreduce(loss)  # the loss averaged over all ranks


losses = []
for batch, (x, y) in enumerate(ds.take(int(os.environ.get("STEPS", "30")))):
    losses.append(float(training_step(x, y, batch == 0)))

total = dist.allreduce(tf.constant([float(dist.rank() + 1)]), 0, 1, op=dist.ReduceOp.SUM)
dist.barrier()
out = os.environ["SM_MODEL_DIR"]
np.savez(os.path.join(out, f"weights-{dist.rank()}.npz"), *model.get_weights())
with open(os.path.join(out, f"rank-{dist.rank()}.json"), "w") as fh:
    json.dump(
        {
            "rank": dist.rank(),
            "size": dist.size(),
            "local_rank": dist.local_rank(),
            "local_size": dist.local_size(),
            "host": os.environ["SM_CURRENT_HOST"],
            "losses": losses,
            "sum": float(total.numpy()[0]),
            "version": dist.__version__,
            "tensorflow": tf.__version__,
            "keras": tf.keras.__name__,
        },
        fh,
    )
dist.shutdown()
