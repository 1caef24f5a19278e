"""The notebook's train_ps.py (the parameter_server estimator's entry point), as written but
for two things a test needs: the data sizes are the test's (64/32/32 records, not CIFAR-10's
40000/10000/10000), and TensorBoard logs go under the output data directory where the
notebook's would go to S3 (``s3://<bucket>/<job>/model``), since TF 1.13 writes an s3://
log_dir with its own S3 client, which no job environment points at shipyard's S3.

Like the notebook's, it is a tf.keras ``fit`` on every host: TF 1.13's Keras reads no
TF_CONFIG, so each host trains its own copy while the parameter servers idle (shipyard's
placement report says so)."""

import argparse
import codecs
import json
import logging
import os
import re

import numpy as np
import tensorflow as tf
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
    if "sourcedir.tar.gz" in args.tensorboard_dir:
        tensorboard_dir = re.sub("source/sourcedir.tar.gz", "model", args.tensorboard_dir)
    else:
        tensorboard_dir = args.tensorboard_dir
    if tensorboard_dir.startswith("s3://"):
        tensorboard_dir = os.path.join(args.output_data_dir, "tensorboard")
    logging.info(f"Writing TensorBoard logs to {tensorboard_dir}")

    logging.info("getting data")
    train_dataset = process_input(
        args.epochs, args.batch_size, args.train, "train", args.data_config
    )
    eval_dataset = process_input(args.epochs, args.batch_size, args.eval, "eval", args.data_config)
    validation_dataset = process_input(
        args.epochs, args.batch_size, args.validation, "validation", args.data_config
    )

    logging.info("configuring model")
    logging.info("Hosts: " + os.environ.get("SM_HOSTS"))
    size = len(args.hosts)
    model = get_model(args.learning_rate, args.weight_decay, args.optimizer, args.momentum, size)
    callbacks = []
    if args.current_host == args.hosts[0]:
        callbacks.append(ModelCheckpoint(args.output_data_dir + "/checkpoint-{epoch}.h5"))
        callbacks.append(CustomTensorBoardCallback(log_dir=tensorboard_dir))

    logging.info("Starting training")
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
    print("tf", tf.__version__, "host", args.current_host, "test loss", score[0], flush=True)

    # PS: Save model and history only on worker 0
    if args.current_host == args.hosts[0]:
        save_history(args.model_dir + "/ps_history.p", history)
        save_model(model, args.model_dir)


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
    parser.add_argument("--hosts", type=list, default=json.loads(os.environ.get("SM_HOSTS")))
    parser.add_argument("--current-host", type=str, default=os.environ.get("SM_CURRENT_HOST"))
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
