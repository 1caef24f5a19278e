"""Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py, for Keras 3, on scikit-learn's
digits (8x8) instead of MNIST.

Written for Horovod and left that way: ``import horovod.tensorflow.keras as hvd``. Under
shipyard's ``mpi`` distribution, with no Horovod installed, that import resolves to
shipyard.horovod:

    est = shipyard.TensorFlow(entry_point="keras3_mnist.py", source_dir="examples/horovod",
                              instance_count=2, instance_type="local",
                              distribution={"mpi": {"enabled": True, "processes_per_host": 2}})
    est.fit({"training": "<dir from examples/data/make_digits.py>"})

The data comes from SM_CHANNEL_TRAINING (train.npz, test.npz); rank 0 exports a SavedModel
to SM_MODEL_DIR/1.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description="Keras 3 digits (MNIST-style) Example")
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.002)
parser.add_argument("--warmup-epochs", type=int, default=2)
parser.add_argument("--model_dir", default=None, help="given by the TensorFlow estimator")
parser.add_argument("--data-dir", default=os.environ.get("SM_CHANNEL_TRAINING"))
parser.add_argument("--sm-model-dir", default=os.environ.get("SM_MODEL_DIR"))
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# Horovod: one CPU thread per worker, as many workers share this machine.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras.utils.set_random_seed(hvd.rank())

train = np.load(os.path.join(args.data_dir, "train.npz"))
test = np.load(os.path.join(args.data_dir, "test.npz"))

# Horovod: each worker trains on its own shard of the data.
x_train, y_train = train["x"][hvd.rank() :: hvd.size()], train["y"][hvd.rank() :: hvd.size()]
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(args.batch_size)

mnist_model = keras.Sequential(
    [
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, [3, 3], padding="same", activation="relu"),
        keras.layers.Conv2D(32, [3, 3], padding="same", activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Dropout(0.1),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(10, activation="softmax"),
    ]
)

# Horovod: adjust learning rate based on number of workers.
scaled_lr = args.lr * hvd.size()
opt = keras.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

mnist_model.compile(
    loss=keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"]
)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    #
    # Note: This callback must be in the list before the ReduceLROnPlateau,
    # TensorBoard or other metrics-based callbacks.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first few epochs. See https://arxiv.org/abs/1706.02677 for details.
    hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs, verbose=1
    ),
]

# Horovod: write logs on worker 0.
verbose = 2 if hvd.rank() == 0 else 0

# Train the model.
# Horovod: adjust number of steps based on number of workers.
steps_per_epoch = len(train["y"]) // (args.batch_size * hvd.size())
mnist_model.fit(
    dataset,
    steps_per_epoch=steps_per_epoch,
    callbacks=callbacks,
    epochs=args.epochs,
    verbose=verbose,
)

# Horovod: every worker evaluates its shard of the test set; the accuracy is averaged.
x_test, y_test = test["x"][hvd.rank() :: hvd.size()], test["y"][hvd.rank() :: hvd.size()]
_, local_accuracy = mnist_model.evaluate(x_test, y_test, verbose=0)
accuracy = float(hvd.allreduce(np.float32(local_accuracy), name="test_accuracy"))
if hvd.rank() == 0:
    print(f"test_accuracy={accuracy:.4f}")
    if args.sm_model_dir:
        mnist_model.export(os.path.join(args.sm_model_dir, "1"))
