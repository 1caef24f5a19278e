"""The notebook's train_hvd.py (the Horovod estimator's entry point), as written but for the
same two things as train_ps.py (the test's data sizes; TensorBoard logs under the output data
directory instead of TF 1.13's own S3 client). Horovod 0.16's Keras API throughout:
``hvd.init()``, a session pinned per local rank, ``DistributedOptimizer`` around a TF 1.x
Keras optimizer, ``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback`` and
``LearningRateWarmupCallback`` without ``initial_lr`` (0.16 read it from the optimizer)."""

import argparse
import codecs
import json
import logging
import os
import re

import numpy as np
import tensorflow as tf
import tensorflow.keras.backend as K
from model_def import get_model
from tensorflow.keras.callbacks import ModelCheckpoint, TensorBoard
from utilities import process_input

logging.getLogger().setLevel(logging.INFO)
tf.logging.set_verbosity(tf.logging.ERROR)

#  Copy inference pre/post-processing script so it will be included in the model package
os.system("mkdir /opt/ml/model/code")
os.system("cp inference.py /opt/ml/model/code")
os.system("cp requirements.txt /opt/ml/model/code")


class CustomTensorBoardCallback(TensorBoard):
    def on_batch_end(self, batch, logs=None):
        pass


def save_history(path, history):
    history_for_json = {}
    # transform float values that aren't json-serializable
    for key in list(history.history.keys()):
        values = history.history[key]
        if isinstance(values, np.ndarray):
            history_for_json[key] = values.tolist()
        elif isinstance(values, list) and isinstance(values[0], (np.float32, np.float64)):
            history_for_json[key] = list(map(float, values))
    with codecs.open(path, "w", encoding="utf-8") as f:
        json.dump(history_for_json, f, separators=(",", ":"), sort_keys=True, indent=4)


def save_model(model, output):
    # create a TensorFlow SavedModel for deployment to a SageMaker endpoint with TensorFlow Serving
    tf.contrib.saved_model.save_keras_model(model, args.model_dir)
    logging.info(f"Model successfully saved at: {output}")


def main(args):
    mpi = False
    if "sourcedir.tar.gz" in args.tensorboard_dir:
        tensorboard_dir = re.sub("source/sourcedir.tar.gz", "model", args.tensorboard_dir)
    else:
        tensorboard_dir = args.tensorboard_dir
    if tensorboard_dir.startswith("s3://"):
        tensorboard_dir = os.path.join(args.output_data_dir, "tensorboard")
    logging.info(f"Writing TensorBoard logs to {tensorboard_dir}")

    if "sagemaker_mpi_enabled" in args.fw_params:
        if args.fw_params["sagemaker_mpi_enabled"]:
            import horovod.tensorflow.keras as hvd

            mpi = True
            # Horovod: initialize Horovod.
            hvd.init()

            # Horovod: pin GPU to be used to process local rank (one GPU per process)
            config = tf.ConfigProto()
            config.gpu_options.allow_growth = True
            config.gpu_options.visible_device_list = str(hvd.local_rank())
            K.set_session(tf.Session(config=config))
    else:
        hvd = None

    logging.info(f"Running with MPI={mpi}")
    logging.info("getting data")
    train_dataset = process_input(
        args.epochs, args.batch_size, args.train, "train", args.data_config
    )
    eval_dataset = process_input(args.epochs, args.batch_size, args.eval, "eval", args.data_config)
    validation_dataset = process_input(
        args.epochs, args.batch_size, args.validation, "validation", args.data_config
    )

    logging.info("configuring model")
    model = get_model(
        args.learning_rate, args.weight_decay, args.optimizer, args.momentum, 1, mpi, hvd
    )
    callbacks = []
    if mpi:
        callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))
        callbacks.append(hvd.callbacks.MetricAverageCallback())
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=5, verbose=1))
        callbacks.append(tf.keras.callbacks.ReduceLROnPlateau(patience=10, verbose=1))
        if hvd.rank() == 0:
            callbacks.append(ModelCheckpoint(args.output_data_dir + "/checkpoint-{epoch}.h5"))
            callbacks.append(CustomTensorBoardCallback(log_dir=tensorboard_dir))
    else:
        callbacks.append(ModelCheckpoint(args.output_data_dir + "/checkpoint-{epoch}.h5"))
        callbacks.append(CustomTensorBoardCallback(log_dir=tensorboard_dir))

    logging.info("Starting training")
    size = 1
    if mpi:
        size = hvd.size()

    history = model.fit(
        x=train_dataset[0],
        y=train_dataset[1],
        steps_per_epoch=(num_examples_per_epoch("train") // args.batch_size) // size,
        epochs=args.epochs,
        validation_data=validation_dataset,
        validation_steps=(num_examples_per_epoch("validation") // args.batch_size) // size,
        callbacks=callbacks,
    )
    score = model.evaluate(
        eval_dataset[0],
        eval_dataset[1],
        steps=num_examples_per_epoch("eval") // args.batch_size,
        verbose=0,
    )
    logging.info(f"Test loss:{score[0]}")
    logging.info(f"Test accuracy:{score[1]}")
    # not the notebook's: what the test compares between the ranks
    # (the trainable ones: BatchNormalization's moving statistics are each rank's own, as
    # they are with Horovod)
    weights = float(sum(np.abs(w).sum() for w in K.batch_get_value(model.trainable_weights)))
    lr = float(K.get_value(model.optimizer.lr))
    rank = hvd.rank() if mpi else 0
    print("tf", tf.__version__, "rank", rank, f"weights {weights:.6f} lr {lr:.8f}", flush=True)

    # Horovod: Save model and history only on worker 0 (i.e. master)
    if mpi:
        if hvd.rank() == 0:
            save_history(args.model_dir + "/hvd_history.p", history)
            return save_model(model, args.model_output_dir)
    else:
        save_history(args.model_dir + "/hvd_history.p", history)
        return save_model(model, args.model_output_dir)


def num_examples_per_epoch(subset="train"):
    # the test's record counts (the notebook's are CIFAR-10's 40000/10000/10000)
    if subset == "train":
        return 64
    elif subset == "validation":
        return 32
    elif subset == "eval":
        return 32
    raise ValueError(f'Invalid data subset "{subset}"')


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", type=str, default=os.environ.get("SM_CHANNEL_TRAIN"))
    parser.add_argument("--validation", type=str, default=os.environ.get("SM_CHANNEL_VALIDATION"))
    parser.add_argument("--eval", type=str, default=os.environ.get("SM_CHANNEL_EVAL"))
    parser.add_argument("--model_dir", type=str, required=True)
    parser.add_argument("--model_output_dir", type=str, default=os.environ.get("SM_MODEL_DIR"))
    parser.add_argument("--output_data_dir", type=str, default=os.environ.get("SM_OUTPUT_DATA_DIR"))
    parser.add_argument("--output-dir", type=str, default=os.environ.get("SM_OUTPUT_DIR"))
    parser.add_argument("--tensorboard-dir", type=str, default=os.environ.get("SM_MODULE_DIR"))
    parser.add_argument("--weight-decay", type=float, default=2e-4)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--data-config", type=json.loads, default=os.environ.get("SM_INPUT_DATA_CONFIG")
    )
    parser.add_argument(
        "--fw-params", type=json.loads, default=os.environ.get("SM_FRAMEWORK_PARAMS")
    )
    parser.add_argument("--optimizer", type=str, default="adam")
    parser.add_argument("--momentum", type=float, default="0.9")
    args = parser.parse_args()
    main(args)
