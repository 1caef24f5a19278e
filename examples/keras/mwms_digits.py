"""A Keras 3 classifier for scikit-learn's digits under MultiWorkerMirroredStrategy.

Run it with the TensorFlow estimator and
``distribution={'multi_worker_mirrored_strategy': {'enabled': True}}``: every instance
runs this script as one worker of TF_CONFIG's cluster (SageMaker's port 8890), each
worker reads its own shard of the data, and the strategy all-reduces the gradients,
so every worker ends with the same weights (printed as ``weights_checksum``).

Keras 3's ``model.fit`` does not run under MultiWorkerMirroredStrategy with more than
one worker (it reduces a whole (x, y) batch with ``strategy.reduce``, which this
strategy accepts only for single values: keras-team/keras#20585), so the Keras 3 model
and optimizer are trained by a short ``strategy.run`` loop. With tf_keras
(``TF_USE_LEGACY_KERAS=1``) ``model.fit`` works as in TensorFlow's tutorial.

    python examples/data/make_digits.py /tmp/digits
    shipyard train mwms_digits.py --source-dir examples/keras --framework tensorflow -n 2 \
        -c training=/tmp/digits --distribution '{"multi_worker_mirrored_strategy": {"enabled": true}}'
"""

import argparse
import json
import os

import numpy as np


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=64, help="global batch")
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--model_dir", default=None, help="given by the TensorFlow estimator")
    parser.add_argument("--sm-model-dir", default=os.environ.get("SM_MODEL_DIR", "/tmp/model"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    return parser.parse_args()


def main():
    args = parse_args()
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG
    import keras  # Keras 3, TensorFlow backend

    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"index": 0})
    workers = strategy.num_replicas_in_sync
    print(f"worker {task['index']} of {workers} (MultiWorkerMirroredStrategy)")
    train = np.load(os.path.join(args.train, "train.npz"))
    test = np.load(os.path.join(args.train, "test.npz"))
    x, y = train["x"][task["index"]::workers], train["y"][task["index"]::workers]
    local_batch = args.batch_size // workers
    steps = len(y) // local_batch
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=0).repeat()
    options = tf.data.Options()  # already sharded by worker above
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.batch(local_batch).with_options(options)
    with strategy.scope():
        keras.utils.set_random_seed(0)  # the same initial weights on every worker
        model = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
        optimizer = keras.optimizers.SGD(args.learning_rate, momentum=0.9)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="none")
    batches = iter(strategy.experimental_distribute_dataset(ds))

    @tf.function
    def train_step(iterator):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)),
                                                  global_batch_size=args.batch_size)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduced
            return loss

        xb, yb = next(iterator)
        return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

    for epoch in range(args.epochs):
        losses = [float(train_step(batches)) for _ in range(steps)]
        print(f"epoch {epoch + 1}/{args.epochs}: loss={np.mean(losses):.4f}")
    predictions = np.argmax(model.predict(test["x"], verbose=0), axis=1)
    print(f"test_accuracy={float(np.mean(predictions == test['y'])):.4f}")
    digest = float(sum(float(np.sum(w)) for w in model.get_weights()))
    print(f"weights_checksum={digest:.6f}")
    target = args.sm_model_dir if task["index"] == 0 else os.path.join(
        os.environ.get("SM_OUTPUT_DATA_DIR", "/tmp"), "worker-model")
    model.export(os.path.join(target, "1"))


if __name__ == "__main__":
    main()
