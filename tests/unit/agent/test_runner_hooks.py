"""The hooks distributions plug into: framework routing, process criticality, own
failure text. Real processes, no job: these are the agent-side contracts."""

import json
import sys

import pytest

from shipyard import distribution as d
from shipyard.agent.__main__ import own_failure_text
from shipyard.agent.processes import Supervisor
from shipyard.errors import DistributionError
from shipyard.jobplan.layout import InstancePaths
from shipyard.jobplan.runner import ProcessSpec


@pytest.mark.parametrize(
    "options,framework,runner",
    [
        ({}, "tensorflow", "tf_parameter_server"),
        ({}, "pytorch", "native_ps"),
        ({}, None, "native_ps"),
        ({"implementation": "shipyard"}, "tensorflow", "native_ps"),
        ({"implementation": "tensorflow"}, "tensorflow", "tf_parameter_server"),
    ],
)
def test_parameter_server_runner_follows_framework_and_implementation(options, framework, runner):
    dist = d.parse({"parameter_server": dict(options, enabled=True)})
    assert dist.runner_for(framework) == runner


def test_other_distributions_ignore_the_framework():
    dist = d.parse({"mpi": {"enabled": True}})
    assert dist.runner_for("tensorflow") == dist.runner_for("pytorch") == "mpi"


def test_unknown_parameter_server_implementation_is_refused():
    with pytest.raises(DistributionError, match="implementation"):
        d.parse({"parameter_server": {"enabled": True, "implementation": "byteps"}})


def _spec(name: str, code: str, tmp_path, **kw) -> ProcessSpec:
    return ProcessSpec(
        name=name, argv=[sys.executable, "-c", code], env={}, cwd=str(tmp_path), **kw
    )


def test_a_non_critical_process_that_dies_is_recorded_and_the_instance_goes_on(tmp_path):
    lost = tmp_path / "agent" / "lost.jsonl"
    specs = [
        _spec("worker-1", "raise SystemExit(3)", tmp_path, critical=False),
        _spec("worker-0", "import time; time.sleep(0.5)", tmp_path),
    ]
    outcome = Supervisor(specs, grace=1, log=lambda m: None, lost_file=str(lost)).run()
    assert outcome.ok
    [record] = [json.loads(line) for line in lost.read_text().splitlines()]
    assert record["process"] == "worker-1" and record["exit_code"] == 3


def test_a_critical_process_that_dies_fails_the_instance(tmp_path):
    specs = [
        _spec("ps", "raise SystemExit(4)", tmp_path),
        _spec("worker", "import time; time.sleep(30)", tmp_path, critical=False),
    ]
    outcome = Supervisor(specs, grace=1, log=lambda m: None).run()
    assert not outcome.ok and outcome.exit_code == 4 and outcome.failed.name == "ps"


def test_a_process_may_write_its_own_failure_text(tmp_path):
    own = tmp_path / "rank-3.failure"
    spec = _spec("mpirun", "", tmp_path, failure_file=str(own))
    paths = InstancePaths(str(tmp_path))
    assert own_failure_text(spec, paths) is None
    own.write_text("ValueError: rank 3 saw shape (2,) where rank 0 has (3,)\n")
    assert own_failure_text(spec, paths).startswith("ValueError: rank 3")
