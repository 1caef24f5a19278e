"""The plan's distribution options, typed per runner, and the runners' one protocol."""

from __future__ import annotations

import logging

import pytest

from shipyard import instance_types
from shipyard.errors import DistributionError
from shipyard.jobplan import options as o
from shipyard.jobplan.plan import build
from shipyard.jobplan.runners import RULES
from shipyard.spec import validated

CPU = instance_types.resolve("ml.m5.xlarge")


def _spec(distribution=None, framework="pytorch", count=2, **extra):
    return validated(
        job_name="typed",
        code={"entry_point": "train.py", "source_dir": "/src"},
        instance_count=count,
        instance_type="ml.m5.xlarge",
        framework=framework,
        framework_version="2.1" if framework else None,
        **({"distribution": distribution} if distribution else {}),
        **extra,
    )


def _restore(runner, raw, count=2, gpus=0):
    return RULES[runner]().restore(raw, count, gpus)


def test_each_runner_restores_its_own_typed_options():
    plain = _restore("plain", {"kind": None})
    assert isinstance(plain, o.PlainOptions) and plain.runner == "plain"
    ps = _restore("native_ps", {"kind": "parameter_server", "num_shards": 3, "policy": "sliced"})
    assert isinstance(ps, o.NativePSOptions)
    assert (ps.ps.num_shards, ps.ps.policy) == (3, "sliced")
    tf_ps = _restore("tf_parameter_server", {"kind": "parameter_server", "ports": {"ps": 2300}})
    assert isinstance(tf_ps, o.TFParameterServerOptions)
    assert tf_ps.layout == "tf2" and tf_ps.ports is not None and tf_ps.ports["ps"] == 2300
    mwms = _restore("multi_worker_mirrored", {"kind": "multi_worker_mirrored_strategy"})
    assert isinstance(mwms, o.MWMSOptions) and mwms.port == 8890
    torch = _restore("torch_distributed", {"kind": "pytorchddp", "master_port": 7000})
    assert isinstance(torch, o.TorchDistributedOptions)
    assert (torch.kind, torch.master_port, torch.processes_per_host) == ("pytorchddp", 7000, None)
    mpi = _restore("mpi", {"kind": "mpi"}, gpus=4)
    assert isinstance(mpi, o.MpiOptions) and mpi.processes_per_host == 4  # one per GPU
    smddp = _restore("mpi", {"kind": "smdistributed.dataparallel", "custom_mpi_options": "-x A"})
    assert (smddp.kind, smddp.custom_mpi_options, smddp.processes_per_host) == (
        "smdistributed.dataparallel",
        "-x A",
        1,
    )


def test_options_are_frozen():
    torch = _restore("torch_distributed", {"kind": "torch_distributed"})
    with pytest.raises(AttributeError):
        torch.master_port = 1  # type: ignore[misc]


def test_the_plan_is_built_once_with_typed_options_and_deciding_hosts(monkeypatch):
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_ENVS", "off")
    plan = build(
        _spec({"kind": "torch_distributed", "options": {"enabled": True, "master_port": 7100}}),
        "ray",  # no sandbox probe: each Ray node decides its own
    )
    assert plan.runner == "torch_distributed"
    assert isinstance(plan.options, o.TorchDistributedOptions)
    assert plan.options.master_port == 7100
    assert plan.deciding_hosts == ("algo-1", "algo-2")
    assert plan.resources.instance_type == "ml.m5.xlarge"
    assert plan.sandbox.mode == "per_node"
    assert plan.with_subnet("127.100.1").addresses == {
        "algo-1": "127.100.1.1",
        "algo-2": "127.100.1.2",
    }


def test_a_plan_without_its_subnet_has_no_addresses(monkeypatch):
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_ENVS", "off")
    with pytest.raises(ValueError, match="no subnet"):
        _ = build(_spec(), "ray").addresses


def test_deciding_hosts_are_the_runners_rule():
    hosts = ["algo-1", "algo-2", "algo-3"]
    mpi = _restore("mpi", {"kind": "mpi"})
    assert RULES["mpi"]().deciding_hosts(mpi, hosts) == ["algo-1"]
    tf_ps = _restore("tf_parameter_server", {"kind": "parameter_server"})
    assert RULES["tf_parameter_server"]().deciding_hosts(tf_ps, hosts) == ["algo-1"]
    for runner in ("plain", "native_ps", "multi_worker_mirrored", "torch_distributed"):
        typed = _restore(runner, {"kind": None})
        assert RULES[runner]().deciding_hosts(typed, hosts) == hosts


@pytest.mark.parametrize(
    "distribution, message",
    [
        (
            {"kind": "torch_distributed", "options": {"enabled": True, "master_port": 80}},
            "distribution['torch_distributed']['master_port'] must be an integer port in "
            "1024..65519, got 80",
        ),
        (
            {"kind": "pytorchddp", "options": {"enabled": True, "rendezvous_timeout": 0}},
            "distribution['pytorchddp']['rendezvous_timeout'] must be a number of seconds > 0",
        ),
        (
            {
                "kind": "smdistributed.dataparallel",
                "options": {"enabled": True, "processes_per_host": "two"},
            },
            "distribution['smdistributed.dataparallel']['processes_per_host'] must be an "
            "integer >= 1, got 'two'",
        ),
        (
            {"kind": "parameter_server", "options": {"enabled": True, "policy": "nope"}},
            "distribution['parameter_server']:",
        ),
    ],
)
def test_bad_options_are_refused_when_the_plan_is_built(distribution, message, monkeypatch):
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_ENVS", "off")
    with pytest.raises(DistributionError) as err:
        build(_spec(distribution), "ray")
    assert message in str(err.value)


def test_mpi_names_an_unknown_option_before_looking_for_mpirun():
    with pytest.raises(DistributionError, match=r"unknown option\(s\) \['master_port'\]"):
        RULES["mpi"]().validate({"kind": "smdistributed.dataparallel", "master_port": 1}, 2, CPU)


def test_unknown_torch_options_are_warned_about_not_refused(caplog):
    with caplog.at_level(logging.WARNING, logger="shipyard.agent"):
        typed = RULES["torch_distributed"]().validate(
            {"kind": "torch_distributed", "colour": "red"}, 2, CPU
        )
    assert typed.runner == "torch_distributed"
    assert "ignoring unknown option(s) ['colour']" in caplog.text


def test_a_runner_this_build_lacks_is_refused_not_run_plain(monkeypatch):
    from shipyard.jobplan import runners

    monkeypatch.delitem(runners.RULES, "mpi")
    with pytest.raises(DistributionError, match="runner is not available"):
        build(_spec({"kind": "mpi", "options": {"enabled": True}}), "ray")


def test_tensorflow_parameter_servers_need_the_tensorflow_estimator(monkeypatch):
    distribution = {
        "kind": "parameter_server",
        "options": {"enabled": True, "implementation": "tensorflow"},
    }
    with pytest.raises(DistributionError, match="needs the TensorFlow estimator"):
        build(_spec(distribution), "ray")


def test_the_agent_registers_one_runner_class_per_rules_class():
    """The agent's runners and the control plane's rules hold the same names, and each
    runner class is its rules class plus ``plan``: the one protocol."""
    from shipyard.agent.runners import RUNNERS, runner_class

    assert set(RUNNERS) == set(RULES)
    for name in RUNNERS:
        runner = runner_class(name)
        assert issubclass(runner, RULES[name]) and runner.name == name
        assert callable(runner().plan)
