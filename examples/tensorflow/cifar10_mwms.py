"""The tutorials' CIFAR-10 CNN, Keras 3 ``model.fit`` under MultiWorkerMirroredStrategy.

Run by ``run.py mwms`` on 2 instances with ``distribution={'multi_worker_mirrored_strategy':
{'enabled': True}}``: every instance runs this script as one worker (TF_CONFIG on
SageMaker's port 8890); each takes its share of every global batch and the gradients
are all-reduced, so both end with the same weights (``weights_checksum``). A plain
Keras 3 script: the Keras bug that breaks ``fit`` with more than one worker
(keras-team/keras#20585) is fixed by shipyard in the job's processes.
"""

import argparse
import json
import os

import cnn
import numpy as np


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=64, help="global batch")
    parser.add_argument("--learning_rate", type=float, default=0.001)
    parser.add_argument("--model_dir", default=None, help="given by the TensorFlow estimator")
    parser.add_argument("--sm-model-dir", default=os.environ.get("SM_MODEL_DIR", "/tmp/model"))
    return parser.parse_args()


def dataset(tf, channel, batch_size, repeat=False):
    ds = tf.data.TFRecordDataset(cnn.record_files(channel)).map(lambda r: cnn.parse(tf, r))
    if repeat:
        ds = ds.shuffle(512, seed=0).repeat()
    options = tf.data.Options()  # one file: each worker takes its share of every batch
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.batch(batch_size).prefetch(2).with_options(options)


def main():
    args = parse_args()
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG
    import keras  # Keras 3

    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"index": 0})
    print(f"worker {task['index']} of {strategy.num_replicas_in_sync}")
    with strategy.scope():
        keras.utils.set_random_seed(0)  # the same initial weights on every worker
        model = cnn.build(keras)
        model.compile(
            optimizer=keras.optimizers.RMSprop(args.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    records = sum(1 for _ in tf.data.TFRecordDataset(cnn.record_files("train")))
    model.fit(
        dataset(tf, "train", args.batch_size, repeat=True),
        epochs=args.epochs,
        steps_per_epoch=max(1, records // args.batch_size),
        verbose=2,
    )
    loss, accuracy = model.evaluate(dataset(tf, "eval", args.batch_size), verbose=0)
    print(f"eval_loss={loss:.4f} eval_accuracy={accuracy:.4f}")
    print(f"weights_checksum={sum(float(np.sum(w)) for w in model.get_weights()):.6f}")
    target = (
        args.sm_model_dir
        if task["index"] == 0
        else os.path.join(os.environ.get("SM_OUTPUT_DATA_DIR", "/tmp"), "worker-model")
    )
    model.export(os.path.join(target, "1"))


if __name__ == "__main__":
    main()
