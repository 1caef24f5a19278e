"""The CLI starts only what a command runs (issue 40): every ``--help`` and the read-only commands
never import pydantic, the spec, staging, the endpoints or the model server; the help line
``--help`` lists for each command is the one the command itself has; parameters read
without pydantic come out as pydantic reads them; describe from the stored spec equals
describe from the validated one. Structure, not timing: the times are in
benchmarks/cli_latency.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from shipyard.cli import app
from shipyard.cli.app import COMMANDS
from shipyard.cli.lazy import _UNSURE, plain_value
from shipyard.control.home import Home
from shipyard.control.lifecycle import Event
from shipyard.control.reading import JobReader
from shipyard.control.store import Store
from shipyard.spec import validated

HEAVY = (
    "pydantic",
    "shipyard.spec",
    "shipyard.control.staging",
    "shipyard.control.endpoints",
    "shipyard.control.client",
    "shipyard.serving",
    "shipyard.sdk",
    "psutil",  # only for a job still running (is its supervisor alive?)
)


def _finished_job(home: str, name: str = "read-me") -> None:
    spec = validated(
        job_name=name,
        code={"entry_point": "train.py", "source_dir": "/src"},
        instance_count=2,
        channels=[
            {"name": "train", "uri": "file:///data", "input_mode": "Pipe"},
            {"name": "test", "uri": "s3://b/k", "compression": "Gzip", "content_type": "a/b"},
        ],
        metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
        distribution={"kind": "torch_distributed", "options": {}},
        tags=[{"Key": "team", "Value": "x"}],
        environment={"A": "1"},
        checkpoint_s3_uri="s3://b/ckpt",
        role="arn:aws:iam::1:role/r",
        max_run=600,
        output_path="file:///tmp/out",
    )
    job_dir = os.path.join(home, "jobs", name)
    os.makedirs(job_dir)
    store = Store(Home.from_env(home).db_path)
    store.create_job(spec, {"lr": "0.1"}, job_dir, "local", None)
    store.transition(name, Event.DOWNLOADING, "Making input data available")
    store.transition(name, Event.FAILED, "Failed", failure_reason="AlgorithmError: boom")


def test_read_only_commands_and_help_import_nothing_heavy(tmp_path) -> None:
    home = str(tmp_path / "home")
    _finished_job(home)
    script = textwrap.dedent(
        f"""
        import contextlib, io, json, sys
        from shipyard.cli.app import app
        runs = [["--help"], ["jobs"], ["jobs", "--json"], ["describe", "read-me"],
                ["describe", "read-me", "--json"], ["logs", "read-me"], ["stop", "read-me"],
                ["metrics", "read-me", "--json"], ["stop", "--help"], ["logs", "--help"],
                ["metrics", "--help"], ["--version"]]
        runs += [[name, "--help"] for name in {list(COMMANDS)!r}]
        runs += [["endpoints", "delete", "--help"], ["server", "env", "--help"]]
        codes, outs = [], []
        for args in runs:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                try:
                    app(args)
                except SystemExit as exc:
                    codes.append(exc.code)
            outs.append(out.getvalue())
        heavy = [m for m in {HEAVY!r} if m in sys.modules]
        print(json.dumps({{"codes": codes, "outs": outs, "heavy": heavy}}))
        """
    )
    env = dict(os.environ, SHIPYARD_HOME=home, COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["codes"] == [0] * (14 + len(COMMANDS)), found
    outs = found["outs"]
    assert "read-me" in outs[1] and "Failed" in outs[1]
    assert json.loads(outs[4])["FailureReason"] == "AlgorithmError: boom"
    assert "read-me: Failed" in outs[6]
    assert outs[11].strip().startswith("shipyard ")
    assert found["heavy"] == [], f"imported by a read-only command: {found['heavy']}"


def test_each_listed_help_line_is_the_commands_own() -> None:
    root = typer.main.get_command(app)
    assert list(root.list_commands(None)) == list(COMMANDS)
    for name, entry in COMMANDS.items():
        assert root.commands[name].help == entry.help, name


def test_top_help_lists_every_command_and_version_and_completion() -> None:
    out = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    for name in COMMANDS:
        assert f" {name} " in out, name
    assert "--version" in out and "--install-completion" in out and "--show-completion" in out
    assert CliRunner().invoke(app, ["--version"]).output.startswith("shipyard ")


@pytest.mark.parametrize(
    ("annotation", "values"),
    [
        (int, [0, 7, -3, "0", "12", "-5", "007", " 5", "5 ", "+5", "1_000", "1.0", "x", "", "-0"]),
        (float, [2.0, "2", "2.5", "-0.25", "1e3", " 1", "nan", "inf", "x", "2.", ".5"]),
        (str, ["", "a b", " x "]),
        (list[str], [(), ("a",), ["a", "b"], ("a", "")]),
    ],
)
def test_plain_values_read_as_pydantic_reads_them(annotation, values) -> None:
    from typer._adapters import try_build_adapter
    from typer.models import OptionInfo

    adapter = try_build_adapter(annotation, OptionInfo())
    assert adapter is not None
    for value in values:
        plain = plain_value(annotation, value)
        if plain is _UNSURE:
            continue  # typer's own coercion reads it (and words its error)
        expected = adapter.validate_python(value)
        assert (plain, type(plain)) == (expected, type(expected)), value


def test_describe_from_the_stored_spec_is_describe_from_the_validated_one(tmp_path) -> None:
    home = str(tmp_path / "home")
    _finished_job(home)
    reader = JobReader(home)
    desc = reader.describe("read-me")
    spec = reader.get("read-me").spec  # validated
    assert desc["AlgorithmSpecification"]["MetricDefinitions"] == [
        m.model_dump() for m in spec.metric_definitions
    ]
    assert desc["InputDataConfig"] == [
        {
            "ChannelName": ch.name,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": ch.s3_data_type,
                    "S3Uri": ch.uri,
                    "S3DataDistributionType": ch.distribution,
                }
            },
            "CompressionType": ch.compression or "None",
            "RecordWrapperType": ch.record_wrapping or "None",
            "InputMode": spec.channel_mode(ch),
            **({"ContentType": ch.content_type} if ch.content_type else {}),
        }
        for ch in spec.channels
    ]
    assert desc["ResourceConfig"]["InstanceCount"] == spec.instance_count == 2
    assert desc["StoppingCondition"] == {"MaxRuntimeInSeconds": spec.max_run}
    assert desc["Tags"] == spec.tags and desc["Environment"] == spec.environment
    assert desc["RoleArn"] == spec.role and desc["OutputDataConfig"]["S3OutputPath"] == (
        spec.output_path
    )
    assert desc["CheckpointConfig"] == {
        "S3Uri": spec.checkpoint_s3_uri,
        "LocalPath": spec.checkpoint_local_path,
    }
    assert desc["Shipyard"]["Distribution"] == dict(spec.distribution)
    assert desc["EnableNetworkIsolation"] is spec.enable_network_isolation
    assert desc["AlgorithmSpecification"]["TrainingImage"] == "shipyard-generic"
