"""The tutorials' CIFAR-10 CNN trained from S3 in File and in Pipe mode.

Starts an S3 API server on loopback (moto's ``moto_server``, unless AWS_ENDPOINT_URL_S3
already points at one), generates CIFAR-10-shaped TFRecords, uploads them, and trains
the same unmodified script twice: File mode (staged into input/data/<channel>/) and
Pipe mode (PipeModeDataset reading FIFOs, one per epoch).

    python examples/keras/cifar10_channels.py [--epochs 2] [--train 2000]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data"))


def loopback_s3() -> subprocess.Popen | None:
    if os.environ.get("AWS_ENDPOINT_URL_S3"):
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "moto_server"),
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ.update(
        AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID=os.environ.get("AWS_ACCESS_KEY_ID", "local"),
        AWS_SECRET_ACCESS_KEY=os.environ.get("AWS_SECRET_ACCESS_KEY", "local"),
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--eval", type=int, default=500)
    parser.add_argument("--bucket", default="shipyard-cifar10")
    args = parser.parse_args()
    server = loopback_s3()
    try:
        import boto3
        import make_cifar_tfrecords

        import shipyard

        s3 = boto3.client("s3", region_name="us-east-1")
        try:
            s3.create_bucket(Bucket=args.bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        with tempfile.TemporaryDirectory() as tmp:
            for split, n, seed in (("train", args.train, 1), ("eval", args.eval, 2)):
                for path in make_cifar_tfrecords.write(os.path.join(tmp, split), n, seed, shards=2):
                    s3.upload_file(
                        path, args.bucket, f"cifar10/{split}/{os.path.basename(path)}.tfrecords"
                    )
        inputs = {split: f"s3://{args.bucket}/cifar10/{split}" for split in ("train", "eval")}
        accuracy = {}
        for mode in ("File", "Pipe"):
            est = shipyard.TensorFlow(
                entry_point="train.py",
                source_dir=os.path.join(HERE, "cifar10_cnn"),
                instance_count=1,
                instance_type="local",
                input_mode=mode,
                framework_version="2.21",
                py_version="py3",
                hyperparameters={"epochs": args.epochs},
                metric_definitions=[{"Name": "eval:accuracy", "Regex": r"eval_accuracy=([0-9.]+)"}],
            )
            est.fit(inputs)
            final = est.latest_training_job.describe()["FinalMetricDataList"]
            accuracy[mode] = next(m["Value"] for m in final if m["MetricName"] == "eval:accuracy")
            print(f"{mode} mode: eval accuracy {accuracy[mode]:.3f}")
        return accuracy
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
