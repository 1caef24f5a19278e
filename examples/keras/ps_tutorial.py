"""TensorFlow's parameter-server tutorial pattern (tf_keras model.fit) on scikit-learn's digits.

Run it on N instances with the TensorFlow estimator and
``distribution={'parameter_server': {'enabled': True}}``: shipyard starts a ps and a
worker server on every instance and runs this script as the chief on algo-1 (TF_CONFIG
in the TF2 layout, TF_USE_LEGACY_KERAS=1 so tf.keras is tf_keras). The branch for
``worker``/``ps`` below is the tutorial's: it is what lets the same script also run
where something else starts it as a server. Unchanged, it trains alone with one
instance (no TF_CONFIG).

    python examples/data/make_digits.py /tmp/digits
    shipyard train ps_tutorial.py --source-dir examples/keras --framework tensorflow -n 2 \
        -c training=/tmp/digits --distribution '{"parameter_server": {"enabled": true}}'
    shipyard describe <job>      # which variable lives on which ps, bytes on the wire
"""

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras = tf_keras (Keras 2)

import numpy as np


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps_per_epoch", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument(
        "--partition",
        type=int,
        default=0,
        help="shard variables of at least this many bytes over the ps (0: off)",
    )
    parser.add_argument("--model_dir", default=None, help="given by the TensorFlow estimator")
    parser.add_argument("--sm-model-dir", default=os.environ.get("SM_MODEL_DIR", "/tmp/model"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    return parser.parse_args()


def build_model(tf):
    return tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )


def main():
    args = parse_args()
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):  # the tutorial's server branch
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=resolver.task_type,
            task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        )
        server.join()
    train = np.load(os.path.join(args.train, "train.npz"))
    test = np.load(os.path.join(args.train, "test.npz"))
    x, y = train["x"], train["y"]

    if resolver.cluster_spec().jobs:  # a cluster: the coordinator of parameter servers
        num_ps = resolver.cluster_spec().num_tasks("ps")
        partitioner = (
            tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=args.partition, max_shards=num_ps
            )
            if args.partition
            else None
        )
        strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    else:
        strategy = tf.distribute.get_strategy()
    print(
        f"strategy: {type(strategy).__name__}, "
        f"workers: {strategy.extended._num_workers if hasattr(strategy.extended, '_num_workers') else 1}"
    )

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(args.batch_size)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y)).repeat()
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(batch).prefetch(2)

    with strategy.scope():
        model = build_model(tf)
        model.compile(
            optimizer=tf.keras.optimizers.legacy.SGD(args.learning_rate, momentum=0.9),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=5,
        )
    model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=2,
    )
    predictions = np.argmax(
        model.predict(test["x"], verbose=0)
        if not resolver.cluster_spec().jobs
        else model(test["x"]).numpy(),
        axis=1,
    )
    print(f"test_accuracy={float(np.mean(predictions == test['y'])):.4f}")
    model.save(os.path.join(args.sm_model_dir, "1"))
    with open(os.path.join(args.sm_model_dir, "variables.json"), "w") as fh:
        json.dump(
            [
                {"name": v.name, "shape": v.shape.as_list(), "dtype": v.dtype.name}
                for v in model.trainable_variables
            ],
            fh,
        )
    print("saved the SavedModel to", os.path.join(args.sm_model_dir, "1"))


if __name__ == "__main__":
    main()
