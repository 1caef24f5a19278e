"""shipyard.spec without pydantic reads every input as the pydantic models did (issue 40).

The models of tests/unit/spec_reference.py are shipyard.spec as it was on pydantic; over
a corpus of good and bad inputs, the plain models must give the same object (the same
``model_dump()`` and the same ``model_dump_json()`` bytes, compact and indented), or the
same errors (location, message, kind, in the same order) and so the same
``validated()`` message byte for byte. And importing shipyard.spec and validating a job
must not import pydantic (0.1 s of every client's start, issue 40).
"""

from __future__ import annotations

import collections
import decimal
import enum
import json
import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from shipyard import spec
from shipyard.errors import ValidationError
from shipyard.spec_model import SpecValidationError, json_float
from tests.unit import spec_reference as ref


def base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"job_name": "job-1", "code": {"entry_point": "train.py"}}
    data.update(over)
    return data


def without(key: str) -> dict[str, Any]:
    data = base(instance_count=2)
    del data[key]
    return data


CH = {"name": "train", "uri": "s3://bucket/train"}
FULL = base(
    framework="tensorflow",
    framework_version="2.13",
    py_version="py310",
    code={
        "entry_point": "train.py",
        "source_dir": "/src",
        "dependencies": ["a", "b"],
        "git_config": {"repo": "https://x/y.git", "branch": "main"},
    },
    hyperparameters={"lr": 1e-5, "n": 3, "big": 1e16, "small": 2.5e-7, "s": 'é\x1f"', "l": [1, {}]},
    instance_count=4,
    instance_type="ml.c5.xlarge",
    distribution={"kind": "mpi", "options": {"processes_per_host": 2}},
    channels=[CH, {**CH, "name": "test", "input_mode": "Pipe", "compression": "Gzip"}],
    input_mode="FastFile",
    output_path="s3://bucket/out",
    checkpoint_s3_uri="s3://bucket/ckpt",
    checkpoint_local_path="/opt/ml/checkpoints/",
    tensorboard={"s3_output_path": "s3://bucket/tb"},
    environment={"A": "1"},
    max_run=60,
    volume_size_gb=100,
    max_retry_attempts=3,
    metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
    tags=[{"Key": "team", "Value": "ml"}],
    model_dir=False,
    role="arn:aws:iam::1:role/x",
    container_log_level=10,
    enable_network_isolation=True,
    host_paths=False,
)

# each case: a function making the JobSpec's keyword arguments (fresh: some are iterators)
CASES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "minimal": lambda m: base(),
    "full": lambda m: json.loads(json.dumps(FULL)),
    "missing job_name": lambda m: without("job_name"),
    "missing code": lambda m: without("code"),
    "missing both": lambda m: {},
    "extra key": lambda m: base(nope=1),
    "extra keys after field errors": lambda m: base(zz=1, instance_count="x", aa=2),
    "job_name int": lambda m: base(job_name=3),
    "job_name bad": lambda m: base(job_name="-bad_name"),
    "job_name bytes": lambda m: base(job_name=b"job-b"),
    "job_name bad utf-8": lambda m: base(job_name=b"\xff"),
    "job_name str subclass": lambda m: base(job_name=type("S", (str,), {})("job-s")),
    "framework wrong": lambda m: base(framework="mxnet"),
    "framework none": lambda m: base(framework=None),
    "framework int": lambda m: base(framework=1),
    "framework_version float": lambda m: base(framework_version=2.13),
    "code str": lambda m: base(code="train.py"),
    "code list": lambda m: base(code=["train.py"]),
    "code missing entry": lambda m: base(code={}),
    "code extra": lambda m: base(code={"entry_point": "t.py", "x": 1}),
    "code instance": lambda m: base(code=m.CodeSpec(entry_point="t.py")),
    "code deps str": lambda m: base(code={"entry_point": "t.py", "dependencies": "a"}),
    "code deps tuple": lambda m: base(code={"entry_point": "t.py", "dependencies": ("a", "b")}),
    "code deps items": lambda m: base(code={"entry_point": "t.py", "dependencies": ["a", 1, None]}),
    "code deps iterator": lambda m: base(code={"entry_point": "t.py", "dependencies": iter("ab")}),
    "code deps deque": lambda m: base(
        code={"entry_point": "t.py", "dependencies": collections.deque(["a"])}
    ),
    "code git_config bad": lambda m: base(
        code={"entry_point": "t.py", "git_config": {"repo": 1, 2: "x"}}
    ),
    "code git_config list": lambda m: base(
        code={"entry_point": "t.py", "git_config": [("a", "b")]}
    ),
    "hps not dict": lambda m: base(hyperparameters=[1]),
    "hps int key": lambda m: base(hyperparameters={1: "a"}),
    "hps empty key": lambda m: base(hyperparameters={"": 1}),
    "hps nan": lambda m: base(hyperparameters={"x": float("nan")}),
    "hps object": lambda m: base(hyperparameters={"x": object}),
    "hps floats": lambda m: base(
        hyperparameters={
            f"f{i}": v
            for i, v in enumerate(
                [
                    0.001,
                    1e-5,
                    1.25e-5,
                    1e-6,
                    1e-7,
                    1e15,
                    1e16,
                    1e17,
                    1.5e300,
                    -0.0,
                    5e-324,
                    -2.5e-5,
                    0.1 + 0.2,
                ]
            )
        }
    ),
    "hps nested keys": lambda m: base(
        hyperparameters={"x": {1: 2, False: 3, 2.5: 4, None: 5}, "t": (1, 2)}
    ),
    "hps big int": lambda m: base(hyperparameters={"x": 2**70}),
    "hps unicode": lambda m: base(hyperparameters={"x": 'é\u2028\x7f\x1f"\\/\n'}),
    "count str": lambda m: base(instance_count="3"),
    "count padded str": lambda m: base(instance_count=" 3.00 "),
    "count underscore": lambda m: base(instance_count="1_0"),
    "count bad underscore": lambda m: base(instance_count="1__0"),
    "count float whole": lambda m: base(instance_count=3.0),
    "count float fraction": lambda m: base(instance_count=3.5),
    "count str fraction": lambda m: base(instance_count="3.5"),
    "count str dot": lambda m: base(instance_count="3."),
    "count inf": lambda m: base(instance_count=float("inf")),
    "count nan": lambda m: base(instance_count=float("nan")),
    "count True": lambda m: base(instance_count=True),
    "count False": lambda m: base(instance_count=False),
    "count zero": lambda m: base(instance_count=0),
    "count None": lambda m: base(instance_count=None),
    "count bytes": lambda m: base(instance_count=b"2"),
    "count bytearray": lambda m: base(instance_count=bytearray(b"2")),
    "count decimal": lambda m: base(instance_count=decimal.Decimal("2")),
    "count decimal fraction": lambda m: base(instance_count=decimal.Decimal("2.5")),
    "count decimal inf": lambda m: base(instance_count=decimal.Decimal("inf")),
    "count hex": lambda m: base(instance_count="0x10"),
    "count IntEnum": lambda m: base(instance_count=enum.IntEnum("N", "ONE TWO").TWO),
    "code mapping": lambda m: base(code=types.MappingProxyType({"entry_point": "t.py"})),
    "channels generator": lambda m: base(channels=(c for c in [CH])),
    "count list": lambda m: base(instance_count=[1]),
    "instance_type int": lambda m: base(instance_type=1),
    "distribution list": lambda m: base(distribution=["mpi"]),
    "distribution unknown kind": lambda m: base(distribution={"kind": "nope"}),
    "channels not list": lambda m: base(channels={"name": "x"}),
    "channels item str": lambda m: base(channels=["train"]),
    "channels item instance": lambda m: base(channels=[m.ChannelSpec(**CH)]),
    "channel bad name": lambda m: base(channels=[{**CH, "name": "bad name"}]),
    "channel missing uri": lambda m: base(channels=[{"name": "train"}]),
    "channel bad mode": lambda m: base(channels=[{**CH, "input_mode": "file"}]),
    "channel bad everything": lambda m: base(
        channels=[
            CH,
            {
                "name": 1,
                "uri": None,
                "distribution": "x",
                "compression": "zip",
                "record_wrapping": "x",
                "s3_data_type": "x",
                "content_type": 1,
                "extra": 1,
            },
        ]
    ),
    "channels duplicated": lambda m: base(
        channels=[CH, CH, {**CH, "name": "b"}, {**CH, "name": "b"}]
    ),
    "input_mode bad": lambda m: base(input_mode="pipe"),
    "input_mode none": lambda m: base(input_mode=None),
    "output_path int": lambda m: base(output_path=1),
    "checkpoint relative": lambda m: base(checkpoint_local_path="ckpt"),
    "checkpoint outside tree no host": lambda m: base(
        checkpoint_local_path="/data", host_paths=False
    ),
    "checkpoint dots": lambda m: base(checkpoint_local_path="/opt/ml/../x"),
    "checkpoint and duplicates": lambda m: base(checkpoint_local_path="x", channels=[CH, CH]),
    "tensorboard str": lambda m: base(tensorboard="s3://x"),
    "tensorboard missing": lambda m: base(tensorboard={}),
    "tensorboard ok": lambda m: base(tensorboard={"s3_output_path": "s3://x", "local_path": "/t"}),
    "environment bad name": lambda m: base(environment={"A=B": "x"}),
    "environment bad value": lambda m: base(environment={"A": 1, "B": None}),
    "max_run zero": lambda m: base(max_run=0),
    "max_run str": lambda m: base(max_run="60"),
    "volume str": lambda m: base(volume_size_gb="30"),
    "volume bool": lambda m: base(volume_size_gb=True),
    "volume range": lambda m: base(volume_size_gb=0),
    "volume float": lambda m: base(volume_size_gb=30.0),
    "retries range": lambda m: base(max_retry_attempts=31),
    "retries str": lambda m: base(max_retry_attempts="2"),
    "metric bad regex": lambda m: base(metric_definitions=[{"Name": "l", "Regex": "("}]),
    "metric missing": lambda m: base(metric_definitions=[{"Name": "l"}]),
    "metric not dict": lambda m: base(metric_definitions=["loss"]),
    "metric instance": lambda m: base(metric_definitions=[m.MetricDefinition(Name="a", Regex="b")]),
    "tags bad": lambda m: base(tags=[{"Key": 1}, "x", {"Value": "y"}]),
    "model_dir str": lambda m: base(model_dir="s3://x/model"),
    "model_dir False": lambda m: base(model_dir=False),
    "model_dir True": lambda m: base(model_dir=True),
    "model_dir zero": lambda m: base(model_dir=0),
    "model_dir zero float": lambda m: base(model_dir=0.0),
    "model_dir one": lambda m: base(model_dir=1),
    "model_dir list": lambda m: base(model_dir=[]),
    "model_dir bytes": lambda m: base(model_dir=b"m"),
    "model_dir bad bytes": lambda m: base(model_dir=b"\xff"),
    "log level str": lambda m: base(container_log_level="10"),
    "isolation strings": lambda m: base(enable_network_isolation="yes", host_paths="off"),
    "isolation bad str": lambda m: base(enable_network_isolation="maybe"),
    "isolation ints": lambda m: base(enable_network_isolation=1, host_paths=0),
    "isolation two": lambda m: base(enable_network_isolation=2),
    "isolation float": lambda m: base(enable_network_isolation=0.5, host_paths=1.0),
    "isolation none": lambda m: base(enable_network_isolation=None),
    "backend bad": lambda m: base(backend="docker"),
    "many errors": lambda m: {
        "job_name": "",
        "code": {"entry_point": 1, "zz": 0},
        "instance_count": "many",
        "channels": [{"name": "a", "uri": "b", "input_mode": "X"}, 3],
        "metric_definitions": [{"Name": 1, "Regex": "("}],
        "tensorboard": {"s3_output_path": 1},
        "model_dir": True,
        "unknown": 1,
    },
}


def outcome(module: Any, make: Callable[[Any], dict[str, Any]]) -> tuple[Any, ...]:
    """What ``module``'s JobSpec makes of the case: its dumps, or its errors and the
    message validated() gives."""
    try:
        job = module.JobSpec(**make(module))
    except (SpecValidationError, ref.PydanticValidationError) as exc:
        errors = [(e["loc"], e["msg"], e["type"]) for e in exc.errors()]
        with pytest.raises(ValidationError) as raised:
            module.validated(**make(module))
        return ("error", errors, str(raised.value))
    return (
        "ok",
        job.model_dump(),
        [type(v).__name__ for v in job.model_dump().values()],  # a str subclass read as str
        job.model_dump_json(),
        job.model_dump_json(indent=1),
        module.validated(**make(module)).model_dump_json(),
    )


def test_the_corpus_is_wide() -> None:
    assert len(CASES) >= 60
    kinds = [outcome(spec, make)[0] for make in CASES.values()]
    assert kinds.count("ok") >= 20 and kinds.count("error") >= 60


@pytest.mark.parametrize("name", list(CASES))
def test_the_same_job_or_the_same_errors(name: str) -> None:
    assert outcome(spec, CASES[name]) == outcome(ref, CASES[name])


@pytest.mark.parametrize("name", [n for n in CASES if outcome(ref, CASES[n])[0] == "ok"])
def test_the_json_reads_back_the_same_way(name: str) -> None:
    stored = ref.JobSpec(**CASES[name](ref)).model_dump_json()
    mine = spec.JobSpec.model_validate_json(stored)
    theirs = ref.JobSpec.model_validate_json(stored)
    assert mine.model_dump_json() == theirs.model_dump_json() == stored
    assert mine.model_dump(mode="json") == theirs.model_dump(mode="json")
    assert mine == spec.JobSpec.model_validate_json(mine.model_dump_json(indent=1))


STORED_BAD = {
    "not an object": "[1]",
    "wrong field": json.dumps(base(instance_count="x", volume_size_gb=0)),
    "extra field": json.dumps(base(nope=1)),
    "missing": json.dumps({"job_name": "a"}),
    "code not an object": json.dumps(base(code="t.py")),
    "deps not an array": json.dumps(base(code={"entry_point": "t", "dependencies": "a"})),
    "hyperparameters not an object": json.dumps(base(hyperparameters=[1])),
    "channels not an array": json.dumps(base(channels={"a": 1})),
    "a tag not an object": json.dumps(base(tags=[1])),
    "model_dir true": json.dumps(base(model_dir=True)),
    "count too big": json.dumps(base()).replace(
        '"job_name"', '"instance_count": 1e400, "job_name"'
    ),
}


@pytest.mark.parametrize("name", list(STORED_BAD))
def test_a_bad_stored_spec_gets_the_same_first_error(name: str) -> None:
    """store._validated_spec words a corrupt record with the first error's loc and msg."""
    with pytest.raises(SpecValidationError) as mine:
        spec.JobSpec.model_validate_json(STORED_BAD[name])
    with pytest.raises(ref.PydanticValidationError) as theirs:
        ref.JobSpec.model_validate_json(STORED_BAD[name])
    listed = lambda exc: [(e["loc"], e["msg"], e["type"]) for e in exc.errors()]  # noqa: E731
    assert listed(mine.value) == listed(theirs.value)


@pytest.mark.parametrize(
    "cls, data",
    [
        ("ChannelSpec", {"name": "x"}),
        ("ChannelSpec", {**CH, "distribution": "ShardedByS3Key", "s3_data_type": "ManifestFile"}),
        ("CodeSpec", {"entry_point": "t.py", "dependencies": ["a"]}),
        ("MetricDefinition", {"Name": "a", "Regex": "[", "x": 1}),
        ("TensorBoardSpec", {"s3_output_path": "s3://b/tb/"}),
    ],
)
def test_the_nested_models_alone(cls: str, data: dict[str, Any]) -> None:
    def made(module: Any) -> Any:
        try:
            model = getattr(module, cls)(**data)
        except (SpecValidationError, ref.PydanticValidationError) as exc:
            return [(e["loc"], e["msg"], e["type"]) for e in exc.errors()]
        return model.model_dump(), model.model_dump_json(), repr(model)

    assert made(spec) == made(ref)


def test_copy_equality_and_the_helpers() -> None:
    job = spec.JobSpec(**CASES["full"](spec))
    other = job.model_copy(update={"output_path": "s3://else"})
    assert other.output_path == "s3://else" and job.output_path == "s3://bucket/out"
    assert other != job and job == spec.JobSpec(**CASES["full"](spec))
    assert job.hosts == ["algo-1", "algo-2", "algo-3", "algo-4"]
    assert (
        job.channel_mode(job.channels[0]) == "FastFile"
        and job.channel_mode(job.channels[1]) == "Pipe"
    )
    assert job.dist.kind == "mpi"
    assert job.tensorboard is not None
    assert job.tensorboard.output_uri("j") == "s3://bucket/tb/j/tensorboard-output"
    assert json_float(float("inf")) == "null"
    for module in (spec, ref):
        job = module.JobSpec(**CASES["minimal"](module))
        job.role = "r"
        with pytest.raises(ValueError) as refused:
            job.nope = 1
        assert str(refused.value) == '"JobSpec" object has no field "nope"'


def test_the_spec_imports_no_pydantic() -> None:
    code = (
        "import sys; from shipyard.spec import validated; "
        "validated(job_name='a', code={'entry_point': 't.py'}, channels=[{'name': 'c', "
        "'uri': 's3://b/c'}], metric_definitions=[{'Name': 'l', 'Regex': 'l=(.*)'}], "
        "tensorboard={'s3_output_path': 's3://b/t'}).model_dump_json(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
