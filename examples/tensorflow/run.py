"""One command per distribution: the tutorials' CIFAR-10 CNN on generated TFRecords.

    python examples/tensorflow/run.py ps      # ParameterServerStrategy, 3 instances (tf_keras)
    python examples/tensorflow/run.py mwms    # MultiWorkerMirroredStrategy, 2 instances (Keras 3)

Writes a small CIFAR-10-shaped data set (examples/data/make_cifar_tfrecords.py, the
tutorials' record format), trains on local instances and prints where the job's model,
logs and (for ps) placement/traffic report are. ``--instances``, ``--train``,
``--epochs`` change the size; ``shipyard describe <job>`` shows the rest.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data"))

SCRIPTS = {
    "ps": ("cifar10_ps.py", {"parameter_server": {"enabled": True}}, 3),
    "mwms": ("cifar10_mwms.py", {"multi_worker_mirrored_strategy": {"enabled": True}}, 2),
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("distribution", choices=sorted(SCRIPTS))
    parser.add_argument("--instances", type=int, default=None)
    parser.add_argument("--train", type=int, default=512, help="training records")
    parser.add_argument("--eval", type=int, default=128, help="evaluation records")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--job-name", default=None)
    args = parser.parse_args(argv)
    import make_cifar_tfrecords

    import shipyard

    script, distribution, default_count = SCRIPTS[args.distribution]
    with tempfile.TemporaryDirectory(prefix="shipyard-cifar-") as data:
        inputs = {}
        for split, n, seed in (("train", args.train, 1), ("eval", args.eval, 2)):
            os.makedirs(os.path.join(data, split))
            make_cifar_tfrecords.write(os.path.join(data, split, f"{split}.tfrecords"), n, seed)
            inputs[split] = os.path.join(data, split)
        est = shipyard.TensorFlow(
            entry_point=script,
            source_dir=HERE,
            instance_count=args.instances or default_count,
            instance_type="local",
            distribution=distribution,
            hyperparameters={"epochs": args.epochs},
            metric_definitions=[{"Name": "eval:accuracy", "Regex": r"eval_accuracy=([0-9.]+)"}],
        )
        est.fit(inputs, job_name=args.job_name)
    desc = est.latest_training_job.describe()
    print(
        f"{desc['TrainingJobName']}: {desc['TrainingJobStatus']}, model at "
        f"{desc['ModelArtifacts']['S3ModelArtifacts']}"
    )
    report = desc.get("Shipyard", {}).get("DistributionReportPath")
    if report:
        print(f"placement and traffic report: {report}")
    return desc


if __name__ == "__main__":
    main()
