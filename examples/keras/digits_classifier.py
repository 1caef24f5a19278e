"""A Keras 3 script-mode classifier for scikit-learn's digits (SageMaker TensorFlow style).

As with SageMaker's TensorFlow estimator it receives --model_dir, reads
SM_CHANNEL_TRAINING and writes a SavedModel under SM_MODEL_DIR/1 (the layout TF
Serving loads). On N instances with no distribution each instance trains on its own
shard (by its index in SM_HOSTS) and algo-1 saves the model.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--model_dir", default=None, help="given by the TensorFlow estimator")
    parser.add_argument("--sm-model-dir", default=os.environ.get("SM_MODEL_DIR"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    parser.add_argument(
        "--hosts", type=json.loads, default=os.environ.get("SM_HOSTS", '["algo-1"]')
    )
    parser.add_argument("--current-host", default=os.environ.get("SM_CURRENT_HOST", "algo-1"))
    return parser.parse_args()


def main():
    args = parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    keras.utils.set_random_seed(0)
    train, test = (
        np.load(os.path.join(args.train, "train.npz")),
        np.load(os.path.join(args.train, "test.npz")),
    )
    rank, world = args.hosts.index(args.current_host), len(args.hosts)
    x, y = train["x"][rank::world], train["y"][rank::world]
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
        optimizer=keras.optimizers.SGD(args.learning_rate * 5, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=2)
    _, acc = model.evaluate(test["x"], test["y"], verbose=0)
    print(f"test_accuracy={acc:.4f}")
    if args.current_host == args.hosts[0]:
        model.export(os.path.join(args.sm_model_dir, "1"))
        print("exported SavedModel to", os.path.join(args.sm_model_dir, "1"))


if __name__ == "__main__":
    main()
