"""A Keras 3 classifier for scikit-learn's digits: plain ``model.fit`` under MultiWorkerMirroredStrategy.

Run it with the TensorFlow estimator and
``distribution={'multi_worker_mirrored_strategy': {'enabled': True}}``: every instance
runs this script as one worker of TF_CONFIG's cluster (SageMaker's port 8890), the
strategy shards the data by worker and all-reduces the gradients, so every worker ends
with the same weights (printed as ``weights_checksum``).

Nothing here works around Keras: Keras 3.15's ``model.fit`` fails under this strategy
with more than one worker (keras-team/keras#20585), and shipyard fixes it in the
job's processes (shipyard.tf.keras_compat; one ``shipyard: Keras ... patched`` line in
each instance's log).

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
    print(
        f"worker {task['index']} of {strategy.num_replicas_in_sync} (MultiWorkerMirroredStrategy)"
    )
    train = np.load(os.path.join(args.train, "train.npz"))
    test = np.load(os.path.join(args.train, "test.npz"))
    ds = tf.data.Dataset.from_tensor_slices((train["x"], train["y"]))
    ds = ds.shuffle(len(train["y"]), seed=0).batch(args.batch_size)  # the global batch
    options = tf.data.Options()  # each worker takes its share of every global batch
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = ds.with_options(options)
    with strategy.scope():
        keras.utils.set_random_seed(0)  # the same initial weights on every worker
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(args.learning_rate, momentum=0.9),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=4,
        )  # shipyard runs it as 1 with >1 worker (logged)
    model.fit(ds, epochs=args.epochs, verbose=2)
    predictions = np.argmax(model.predict(test["x"], verbose=0), axis=1)
    print(f"test_accuracy={float(np.mean(predictions == test['y'])):.4f}")
    digest = float(sum(float(np.sum(w)) for w in model.get_weights()))
    print(f"weights_checksum={digest:.6f}")
    target = (
        args.sm_model_dir
        if task["index"] == 0
        else os.path.join(os.environ.get("SM_OUTPUT_DATA_DIR", "/tmp"), "worker-model")
    )
    model.export(os.path.join(target, "1"))


if __name__ == "__main__":
    main()
