"""The tutorials' Keras CNN on CIFAR-10 TFRecords, in File or Pipe mode, unchanged
from SageMaker: in Pipe mode it reads through sagemaker_tensorflow.PipeModeDataset.

conv32-conv32-pool-conv64-conv64-pool-dense512-dense10 with dropout, as in the
SageMaker tensorflow_keras_CIFAR10 tutorial.
"""

import argparse
import glob
import json
import os

import tensorflow as tf
from tensorflow import keras


def parse(record):
    features = tf.io.parse_single_example(
        record,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    image = tf.reshape(tf.io.decode_raw(features["image"], tf.uint8), (32, 32, 3))
    return tf.cast(image, tf.float32) / 255.0, features["label"]


def dataset(channel, batch_size):
    mode = json.loads(os.environ["SM_INPUT_DATA_CONFIG"])[channel]["TrainingInputMode"]
    if mode == "Pipe":
        from sagemaker_tensorflow import PipeModeDataset

        ds = PipeModeDataset(channel=channel, record_format="TFRecord")
    else:
        files = sorted(glob.glob(os.path.join(os.environ["SM_CHANNEL_" + channel.upper()], "*")))
        ds = tf.data.TFRecordDataset(files)
    return ds.map(parse).batch(batch_size).prefetch(2)


def model(learning_rate):
    m = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Dropout(0.25),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    m.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return m


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    args, _ = parser.parse_known_args()
    net = model(args.learning_rate)
    # Each Keras epoch makes a new iterator: in Pipe mode that opens the next epoch's FIFO.
    # TensorBoard logs where SageMaker's tensorboard_output_config looks (synced by shipyard)
    logdir = os.path.join(os.environ.get("SM_OUTPUT_DIR", "/opt/ml/output"), "tensorboard")
    net.fit(
        dataset("train", args.batch_size),
        epochs=args.epochs,
        verbose=2,
        callbacks=[keras.callbacks.TensorBoard(logdir)],
    )
    loss, acc = net.evaluate(dataset("eval", args.batch_size), verbose=0)
    print(f"eval_loss={loss:.4f} eval_accuracy={acc:.4f}")
    net.save(os.path.join(os.environ["SM_MODEL_DIR"], "cnn.keras"))
