"""The flagship scenario, as far as shipyard has it today (run by `make demo`).

1. scikit-learn's digits become a training channel (no download);
2. the Keras 3 classifier trains on 2 local instances with the TensorFlow estimator,
   logs streamed with host prefixes, its metric scraped from the log;
3. the PyTorch classifier does the same with the PyTorch estimator;
4. describe() shows status, metrics and the model.tar.gz each job produced.

As the parameter-server, serving and data issues land, this grows into the tutorials'
Keras CNN on 2 instances with the parameter server, its placement report, a deployed
endpoint and a prediction.
"""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "data"))

from make_digits import write_digits  # noqa: E402

import shipyard  # noqa: E402

METRICS = [{"Name": "test:accuracy", "Regex": r"test_accuracy=([0-9.]+)"}]


def show(estimator) -> None:
    desc = estimator.latest_training_job.describe()
    print(
        f"\n== {desc['TrainingJobName']}: {desc['TrainingJobStatus']} "
        f"({desc.get('TrainingTimeInSeconds', 0)} s)"
    )
    for metric in desc["FinalMetricDataList"]:
        print(f"   {metric['MetricName']} = {metric['Value']}")
    path = estimator.model_data.removeprefix("file://")
    with tarfile.open(path) as tar:
        names = tar.getnames()
    print(f"   model: {estimator.model_data} ({len(names)} entries, e.g. {names[:3]})\n")


def main() -> None:
    home = os.environ.get("SHIPYARD_HOME") or os.path.join(HERE, "..", ".shipyard")
    session = shipyard.Session(home=home)
    data = tempfile.mkdtemp(prefix="shipyard-digits-")
    write_digits(data)

    keras_job = shipyard.TensorFlow(
        entry_point="digits_classifier.py",
        source_dir=os.path.join(HERE, "keras"),
        instance_count=2,
        instance_type="local",
        framework_version="2.21",
        py_version="py311",
        hyperparameters={"epochs": 12, "batch_size": 32},
        metric_definitions=METRICS,
        session=session,
    )
    keras_job.fit({"training": data})
    show(keras_job)

    torch_job = shipyard.PyTorch(
        entry_point="digits_classifier.py",
        source_dir=os.path.join(HERE, "pytorch"),
        instance_count=2,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        hyperparameters={"epochs": 15},
        metric_definitions=METRICS,
        session=session,
    )
    torch_job.fit({"training": data})
    show(torch_job)
    print(
        f"jobs are recorded in {session.home}: try `shipyard jobs` and "
        f"`shipyard describe {torch_job.latest_training_job.job_name}`"
    )


if __name__ == "__main__":
    main()
