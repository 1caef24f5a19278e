"""The tutorials' Keras CNN and TFRecord parser, shared by both distributed scripts here.

conv32-conv32-pool-conv64-conv64-pool-dense512-dense10 with dropout, as in SageMaker's
tensorflow_keras_CIFAR10 tutorial. ``keras`` is passed in: the parameter-server script
builds it with tf_keras (``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``, which
ParameterServerStrategy needs), the mirrored one with Keras 3.
"""

import glob
import os

HEIGHT, WIDTH, DEPTH, CLASSES = 32, 32, 3, 10


def build(keras):
    return keras.Sequential(
        [
            keras.Input((HEIGHT, WIDTH, DEPTH)),
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
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )


def record_files(channel):
    """The channel's TFRecord files (``SM_CHANNEL_<NAME>``), sorted."""
    directory = os.environ["SM_CHANNEL_" + channel.upper()]
    return sorted(glob.glob(os.path.join(directory, "**", "*.tfrecords*"), recursive=True))


def parse(tf, record):
    """The tutorials' record: ``image`` (raw uint8 bytes, 32x32x3) and ``label`` (int64)."""
    features = tf.io.parse_single_example(
        record,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    image = tf.reshape(tf.io.decode_raw(features["image"], tf.uint8), (HEIGHT, WIDTH, DEPTH))
    return tf.cast(image, tf.float32) / 255.0, features["label"]
