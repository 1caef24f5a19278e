"""The tutorials' Keras CNN, Keras 3 ``model.fit``, trained asynchronously through shipyard.ps.

Keras 3 has no ParameterServerStrategy; with shipyard's native parameter server the
tutorial's script keeps ``model.fit`` and changes one line (the optimizer is wrapped
in ``shipyard.ps.keras.DistributedOptimizer``). Run it with the TensorFlow estimator
and ``implementation='shipyard'`` (plain ``parameter_server`` under the TensorFlow
estimator means TensorFlow's own parameter servers)::

    est = shipyard.TensorFlow(entry_point="ps_cnn.py", source_dir="examples/keras",
                              instance_count=2, instance_type="local",
                              distribution={"parameter_server": {"enabled": True,
                                                                 "implementation": "shipyard"}})
    est.fit({"training": "file:///tmp/digits"})  # python examples/data/make_digits.py /tmp/digits

Each worker (SHIPYARD_PS_RANK of SHIPYARD_PS_NUM_WORKERS) fits on its own shard of
the data; the shards run Adam. Rank 0 exports the SavedModel to SM_MODEL_DIR/1.

The network: conv32-conv32-pool-conv64-conv64-pool-dense512-dense10 with dropout
(the tutorials' CIFAR-10 CNN, sized for 8x8 digit images).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=0.002)
    parser.add_argument("--model_dir", default=None, help="given by the TensorFlow estimator")
    parser.add_argument("--sm-model-dir", default=os.environ.get("SM_MODEL_DIR"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    return parser.parse_args()


def cnn(keras, num_classes: int = 10):
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Dropout(0.25),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(512, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )


def main():
    args = parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import shipyard.ps.keras as ps_keras

    keras.utils.set_random_seed(0)
    rank = int(os.environ.get("SHIPYARD_PS_RANK", "0"))
    world = int(os.environ.get("SHIPYARD_PS_NUM_WORKERS", "1"))
    train, test = (
        np.load(os.path.join(args.train, "train.npz")),
        np.load(os.path.join(args.train, "test.npz")),
    )
    x, y = train["x"][rank::world], train["y"][rank::world]
    model = cnn(keras)
    model.compile(
        optimizer=ps_keras.DistributedOptimizer(keras.optimizers.Adam(args.learning_rate)),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=2)
    _, acc = model.evaluate(test["x"], test["y"], verbose=0)
    if rank == 0:  # the model it exports is the job's: its accuracy is the job's metric
        print(f"test_accuracy={acc:.4f}", flush=True)
        model.export(os.path.join(args.sm_model_dir, "1"))
        print("exported SavedModel to", os.path.join(args.sm_model_dir, "1"))
    else:
        print(f"rank={rank} accuracy={acc:.4f} (weights as of its last step)", flush=True)


if __name__ == "__main__":
    main()
