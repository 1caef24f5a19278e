"""Pipe mode and File staging throughput, each measured side by side with its baseline.

1. Pipe: MB/s of record bytes delivered by PipeModeDataset (feeder process -> FIFO ->
   record splitting -> tf.data) vs tf.data.TFRecordDataset reading the same TFRecord
   file directly. Goal: ratio >= 0.5. Both are drained with Dataset.reduce (no Python
   per record on either side).
2. File staging: seconds to stage N MB (default 1024) of objects from a loopback S3
   server (moto_server, a separate process) through shipyard's File-mode code path vs
   a plain boto3 loop (s3.download_file per object) of the same objects.

    python benchmarks/pipe_throughput.py [--pipe-mb 256] [--stage-mb 1024] [--runs 3]

Runs alternate between the two sides; medians are reported. The data is generated
(CIFAR-10-shaped tf.train.Examples: 32x32x3 uint8 image + label), nothing downloads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def cifar_tfrecord(path: str, megabytes: int) -> int:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    n = megabytes * (1 << 20) // 3100
    with tf.io.TFRecordWriter(path) as writer:
        images = rng.integers(0, 256, size=(1000, 32 * 32 * 3), dtype=np.uint8)
        for i in range(n):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[images[i % 1000].tobytes()])
                        ),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
                    }
                )
            )
            writer.write(example.SerializeToString())
    return n


def drain(ds) -> int:
    import tensorflow as tf

    return int(
        ds.reduce(
            tf.constant(0, tf.int64), lambda acc, x: acc + tf.cast(tf.strings.length(x), tf.int64)
        )
    )


def bench_pipe(megabytes: int, runs: int, work: str) -> dict:
    import tensorflow as tf

    from shipyard.agent.channels.source import ChannelSource
    from shipyard.data.tensorflow import PipeModeDataset

    data_dir = os.path.join(work, "src")
    os.makedirs(data_dir)
    path = os.path.join(data_dir, "train.tfrecords")
    records = cifar_tfrecord(path, megabytes)
    base = os.path.join(work, "instance")
    for d in ("input/config", "input/data"):
        os.makedirs(os.path.join(base, d))
    with open(os.path.join(base, "input/config/inputdataconfig.json"), "w") as fh:
        json.dump(
            {
                "train": {
                    "TrainingInputMode": "Pipe",
                    "S3DistributionType": "FullyReplicated",
                    "RecordWrapperType": "None",
                }
            },
            fh,
        )
    source = ChannelSource(
        "train", data_dir, "Pipe", ["algo-1"], "algo-1", {"TrainingInputMode": "Pipe"}
    )
    spec = os.path.join(work, "pipe-train.json")
    with open(spec, "w") as fh:
        fh.write(source.to_json())
    feeder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shipyard.agent.channels.feeder",
            "--source",
            spec,
            "--input-data",
            os.path.join(base, "input/data"),
        ],
        stdout=subprocess.DEVNULL,
    )
    os.environ["SAGEMAKER_BASE_DIR"] = base
    direct, piped = [], []
    try:
        pipe_ds = PipeModeDataset("train", record_format="TFRecord")
        file_ds = tf.data.TFRecordDataset(path, buffer_size=8 << 20)
        drain(file_ds)  # warm the page cache and tf.function tracing for both sides
        drain(pipe_ds)
        for _ in range(runs):
            t = time.perf_counter()
            nbytes = drain(file_ds)
            direct.append(nbytes / 1e6 / (time.perf_counter() - t))
            t = time.perf_counter()
            pbytes = drain(pipe_ds)
            piped.append(pbytes / 1e6 / (time.perf_counter() - t))
            assert pbytes == nbytes, (pbytes, nbytes)
    finally:
        feeder.terminate()
        feeder.wait()
    d, p = statistics.median(direct), statistics.median(piped)
    return {
        "records": records,
        "record_mb": nbytes / 1e6,
        "direct_mb_s": d,
        "pipe_mb_s": p,
        "ratio": p / d,
        "direct_runs": direct,
        "pipe_runs": piped,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_staging(megabytes: int, runs: int, work: str) -> dict:
    import boto3

    from shipyard import storage
    from shipyard.agent.channels.file import download_objects

    port = free_port()
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
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL_S3=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
    )
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for _ in range(100):
            try:
                s3.create_bucket(Bucket="bench")
                break
            except Exception:  # noqa: BLE001 - server still starting
                time.sleep(0.1)
        count = max(1, megabytes // 64)
        blob = os.urandom(64 << 20)
        for i in range(count):
            s3.put_object(Bucket="bench", Key=f"data/part-{i:03d}", Body=blob)
        objects = storage.list_channel("s3://bench/data")
        store = storage.store_for("s3://bench/data")
        ours, plain = [], []
        for r in range(runs):
            dest = os.path.join(work, f"plain-{r}")
            os.makedirs(dest)
            t = time.perf_counter()
            for obj in objects:
                s3.download_file("bench", obj.location.key, os.path.join(dest, obj.relative))
            plain.append(time.perf_counter() - t)
            shutil.rmtree(dest)
            dest = os.path.join(work, f"ours-{r}")
            t = time.perf_counter()
            download_objects(store, objects, dest, "bench", lambda m: None)
            ours.append(time.perf_counter() - t)
            shutil.rmtree(dest)
    finally:
        server.terminate()
        server.wait()
    total = sum(o.size for o in objects) / 1e6
    o, p = statistics.median(ours), statistics.median(plain)
    return {
        "mb": total,
        "objects": len(objects),
        "shipyard_s": o,
        "boto3_s": p,
        "shipyard_mb_s": total / o,
        "boto3_mb_s": total / p,
        "speedup": p / o,
        "shipyard_runs": ours,
        "boto3_runs": plain,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipe-mb", type=int, default=256)
    parser.add_argument("--stage-mb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="shipyard-pipe-bench-")
    try:
        pipe = bench_pipe(args.pipe_mb, args.runs, os.path.join(work, "pipe"))
        print(
            f"Pipe -> PipeModeDataset: {pipe['pipe_mb_s']:.0f} MB/s vs TFRecordDataset on "
            f"the file: {pipe['direct_mb_s']:.0f} MB/s -> ratio {pipe['ratio']:.2f} "
            f"(goal >= 0.5; {pipe['records']} records, {pipe['record_mb']:.0f} MB, medians "
            f"of {args.runs})"
        )
        stage = bench_staging(args.stage_mb, args.runs, os.path.join(work, "stage"))
        print(
            f"File staging of {stage['mb']:.0f} MB ({stage['objects']} objects) from "
            f"loopback S3: shipyard {stage['shipyard_s']:.2f} s "
            f"({stage['shipyard_mb_s']:.0f} MB/s) vs plain boto3 download_file loop "
            f"{stage['boto3_s']:.2f} s ({stage['boto3_mb_s']:.0f} MB/s) -> "
            f"{stage['speedup']:.2f}x"
        )
        print(json.dumps({"pipe": pipe, "staging": stage}, indent=1))
        from _result import result

        result(
            "pipe_throughput",
            pipe_ratio=pipe["ratio"],
            pipe_mb_s=pipe["pipe_mb_s"],
            staging_speedup=stage["speedup"],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
