"""The tutorials' CIFAR-10 CNN with ParameterServerStrategy: TensorFlow's PS tutorial pattern.

Run by ``run.py ps`` on 3 instances with ``distribution={'parameter_server': {'enabled':
True}}``: shipyard starts a ps and a worker server on every instance and runs this
script on algo-1 as the chief (the coordinator), with TF_CONFIG in the TF2 layout and
``TF_USE_LEGACY_KERAS=1`` (tf.keras is tf_keras, which ParameterServerStrategy needs).
The variables live on the three ps tasks; the workers run the steps. Nothing here is
specific to shipyard: the ``worker``/``ps`` branch is the tutorial's, for clusters where
something else starts the script as a server. Without TF_CONFIG it trains alone.

On one machine (the local backend) the worker servers read the chief's copy of the
channel: the dataset function is traced on the chief with its file paths.
"""

import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras = tf_keras (Keras 2)

import cnn
import numpy as np


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_epoch", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=0.001)
    parser.add_argument("--model_dir", default=None, help="given by the TensorFlow estimator")
    parser.add_argument("--sm-model-dir", default=os.environ.get("SM_MODEL_DIR", "/tmp/model"))
    return parser.parse_args()


def main():
    args = parse_args()
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):  # the tutorial's server branch
        tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=resolver.task_type,
            task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        ).join()
    in_cluster = bool(resolver.cluster_spec().jobs)
    strategy = (
        tf.distribute.ParameterServerStrategy(resolver)
        if in_cluster
        else tf.distribute.get_strategy()
    )
    print(f"strategy: {type(strategy).__name__}")
    train_files = cnn.record_files("train")

    def dataset_fn(input_context):
        ds = tf.data.TFRecordDataset(train_files).repeat()
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        ds = ds.map(lambda r: cnn.parse(tf, r)).shuffle(256)
        return ds.batch(input_context.get_per_replica_batch_size(args.batch_size)).prefetch(2)

    with strategy.scope():
        model = cnn.build(tf.keras)
        model.compile(
            optimizer=tf.keras.optimizers.legacy.RMSprop(args.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=2,
    )
    # evaluated here on the coordinator, which reads the variables from the ps tasks
    correct = total = 0
    for x, y in (
        tf.data.TFRecordDataset(cnn.record_files("eval")).map(lambda r: cnn.parse(tf, r)).batch(128)
    ):
        correct += int(np.sum(np.argmax(model(x, training=False).numpy(), axis=1) == y.numpy()))
        total += int(y.shape[0])
    print(f"eval_accuracy={correct / total:.4f}")
    model.save(os.path.join(args.sm_model_dir, "1"))
    print("saved the SavedModel to", os.path.join(args.sm_model_dir, "1"))


if __name__ == "__main__":
    main()
