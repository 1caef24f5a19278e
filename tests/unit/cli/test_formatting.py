"""What the terminal shows (issue 41): bytes as people read them, run times, the
hyperparameters as the script receives them, doctor's fixes folded, never cut."""

from __future__ import annotations

import datetime as dt
import io

from rich.console import Console

from shipyard.cli import describe_view
from shipyard.cli.doctor import Check, table
from shipyard.observe.metrics_view import human_bytes, value_text


def test_bytes_read_as_bytes():
    assert human_bytes(2.63e7) == "26.3 MB"
    assert human_bytes(512) == "512 B"
    assert human_bytes(999_960) == "1.0 MB"
    assert human_bytes(3.2e12) == "3.2 TB"
    assert value_text("NetworkRxBytes", 2.63e7) == "26.3 MB"
    assert value_text("CPUUtilization", 12.345) == "12.3%"
    assert value_text("train_loss", 0.25) == "0.25"


def test_durations_and_hyperparameters():
    assert describe_view.duration(4.21) == "4.2s"
    assert describe_view.duration(184) == "3m 04s"
    assert describe_view.duration(7500) == "2h 05m"
    stored = {"epochs": "3", "name": '"abc"', "layers": "[1, 2]", "sagemaker_program": '"t.py"'}
    assert describe_view.hyperparameters(stored) == ["epochs=3", "layers=[1, 2]", "name=abc"]


def test_configuration_block_names_every_part():
    utc = dt.timezone.utc
    desc = {
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2},
        "HyperParameters": {"epochs": "3", "sagemaker_program": '"train.py"'},
        "InputDataConfig": [
            {
                "ChannelName": "training",
                "DataSource": {"S3DataSource": {"S3Uri": "s3://b/train"}},
                "InputMode": "Pipe",
            }
        ],
        "Tags": [{"Key": "team", "Value": "vision"}],
        "CreationTime": dt.datetime(2026, 1, 2, 3, 4, 0, tzinfo=utc),
        "TrainingStartTime": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=utc),
        "TrainingEndTime": dt.datetime(2026, 1, 2, 3, 7, 9, tzinfo=utc),
        "Shipyard": {"Framework": "pytorch", "FrameworkVersion": "2.1", "PyVersion": "py310"},
    }
    out = io.StringIO()
    Console(file=out, width=120).print(describe_view.configuration(desc))
    text = out.getvalue()
    for expected in (
        "2 x ml.m5.xlarge",
        "pytorch 2.1 py310",
        "train.py",
        "epochs=3",
        "training  s3://b/train  (Pipe)",
        "team=vision",
        "3m 04s",
    ):
        assert expected in text, (expected, text)


def test_doctor_folds_a_long_fix_to_the_terminal_instead_of_cutting_it():
    fix = "pip install 'shipyard[tensorflow]' && export PATH=/opt/a/very/long/path/" + "x" * 60
    out = io.StringIO()
    Console(file=out, width=80).print(table([Check("TensorFlow", False, "not installed", fix)]))
    text = out.getvalue()
    assert "…" not in text
    joined = "".join(ln.split("│")[4].strip() for ln in text.splitlines() if ln.count("│") == 5)
    assert joined.replace(" ", "") == fix.replace(" ", "")
