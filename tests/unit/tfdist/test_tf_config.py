"""TF_CONFIG of every process, byte for byte, and the processes each instance runs.

Expected strings are written out literally from the toolkit's rules
(sagemaker-tensorflow-training-toolkit training.py: ``json.dumps`` of
{"cluster": {"master", "ps", "worker"}, "environment": "cloud", "task": {"index", "type"}},
ports 2222/2223; multi-worker mirrored: every host a worker on 8890), with shipyard's one
change: a process's own address carries its private port (here 4xxxx from a fixed picker).
"""

from __future__ import annotations

import json
import os

import pytest

from shipyard.agent.runners import multi_worker_mirrored, tf_parameter_server
from shipyard.jobplan.layout import InstancePaths
from shipyard.jobplan.runner import InstanceContext
from tests.agent_configs import local_config

HOSTS = ["algo-1", "algo-2", "algo-3"]
ADDR = {"algo-1": "127.9.9.1", "algo-2": "127.9.9.2", "algo-3": "127.9.9.3"}


def ctx(tmp_path, host: str, options: dict, hosts=HOSTS) -> InstanceContext:
    config = local_config(
        str(tmp_path), {h: ADDR[h] for h in hosts}, runner_options=options, job_secret="s3cret"
    )
    paths = InstancePaths(os.path.join(tmp_path, host))
    env = {"PYTHONPATH": os.pathsep.join(["/code", "/resolver"]), "SM_CURRENT_HOST": host}
    return InstanceContext(
        config=config,
        host=host,
        paths=paths,
        env=env,
        user_command=["python", "train.py", "--epochs", "1"],
    )


def picker():
    ports = iter(range(40001, 40100))
    return lambda: next(ports)


def by_name(specs):
    return {s.name: s for s in specs}


def test_sagemaker_layout_byte_exact(tmp_path):
    opts = {"enabled": True, "layout": "sagemaker", "kind": "parameter_server"}
    master = by_name(tf_parameter_server.plan(ctx(tmp_path, "algo-1", opts), picker()))
    assert set(master) == {"ps:0", "master:0"}
    assert master["master:0"].env["TF_CONFIG"] == (
        '{"cluster": {"master": ["127.9.9.1:40001"], "ps": ["127.9.9.1:2223", '
        '"127.9.9.2:2223", "127.9.9.3:2223"], "worker": ["127.9.9.2:2222", "127.9.9.3:2222"]}, '
        '"environment": "cloud", "task": {"index": 0, "type": "master"}}'
    )
    assert master["ps:0"].env["TF_CONFIG"] == (
        '{"cluster": {"master": ["127.9.9.1:2222"], "ps": ["127.9.9.1:40002", '
        '"127.9.9.2:2223", "127.9.9.3:2223"], "worker": ["127.9.9.2:2222", "127.9.9.3:2222"]}, '
        '"environment": "cloud", "task": {"index": 0, "type": "ps"}}'
    )
    worker = by_name(tf_parameter_server.plan(ctx(tmp_path, "algo-3", opts), picker()))
    assert worker["worker:1"].env["TF_CONFIG"] == (
        '{"cluster": {"master": ["127.9.9.1:2222"], "ps": ["127.9.9.1:2223", '
        '"127.9.9.2:2223", "127.9.9.3:2223"], "worker": ["127.9.9.2:2222", "127.9.9.3:40002"]}, '
        '"environment": "cloud", "task": {"index": 1, "type": "worker"}}'
    )
    # the user's script on a worker: not critical; the ps keeps the instance alive
    assert worker["worker:1"].argv == ["python", "train.py", "--epochs", "1"]
    assert not worker["worker:1"].critical and worker["ps:2"].critical
    assert worker["ps:2"].role == "main" and master["ps:0"].role == "service"
    assert "--relay" in worker["ps:2"].argv
    assert "worker:1=127.9.9.3:2222>127.9.9.3:40002" in worker["ps:2"].argv
    assert "TF_USE_LEGACY_KERAS" not in master["master:0"].env


def test_tf2_layout_byte_exact(tmp_path):
    opts = {"enabled": True, "kind": "parameter_server"}  # tf2 is the default
    c1 = ctx(tmp_path, "algo-1", opts)
    chief = by_name(tf_parameter_server.plan(c1, picker()))
    assert set(chief) == {"ps:0", "chief:0", "worker:0"}
    assert chief["chief:0"].env["TF_CONFIG"] == (
        '{"cluster": {"chief": ["127.9.9.1:40001"], "ps": ["127.9.9.1:2223", '
        '"127.9.9.2:2223", "127.9.9.3:2223"], "worker": ["127.9.9.1:2224", "127.9.9.2:2224", '
        '"127.9.9.3:2224"]}, "environment": "cloud", "task": {"index": 0, "type": "chief"}}'
    )
    assert (
        chief["worker:0"]
        .env["TF_CONFIG"]
        .endswith(
            '"worker": ["127.9.9.1:40003", "127.9.9.2:2224", "127.9.9.3:2224"]}, '
            '"environment": "cloud", "task": {"index": 0, "type": "worker"}}'
        )
    )
    spec = chief["chief:0"]
    assert spec.argv[1:3] == ["-m", "shipyard.tf.chief"]
    assert spec.argv[spec.argv.index("--") + 1 :] == ["python", "train.py", "--epochs", "1"]
    assert "127.9.9.1:2223,127.9.9.2:2223,127.9.9.3:2223" in spec.argv
    assert spec.env["TF_USE_LEGACY_KERAS"] == "1" and spec.env["SHIPYARD_PEER_LABEL"] == "chief:0"
    path = spec.env["PYTHONPATH"].split(os.pathsep)
    assert path[0] == "/code" and path[2].endswith(os.path.join("shipyard", "tf", "_hook"))
    assert chief["worker:0"].role == "service" and not chief["worker:0"].critical
    assert chief["ps:0"].env["CUDA_VISIBLE_DEVICES"] == ""
    assert chief["ps:0"].env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert any("TF_USE_LEGACY_KERAS=1" in n for n in c1.notes)
    other = by_name(tf_parameter_server.plan(ctx(tmp_path, "algo-2", opts), picker()))
    assert set(other) == {"ps:1", "worker:1"}
    assert other["ps:1"].role == other["worker:1"].role == "main"
    assert other["ps:1"].critical and not other["worker:1"].critical
    assert tf_parameter_server.TFParameterServerRunner().deciding_hosts(opts, HOSTS) == ["algo-1"]


def test_ports_option_and_single_instance(tmp_path):
    opts = {"enabled": True, "ports": {"ps": 3333}, "kind": "parameter_server"}
    chief = by_name(tf_parameter_server.plan(ctx(tmp_path, "algo-1", opts), picker()))
    assert (
        '"ps": ["127.9.9.1:3333", "127.9.9.2:3333", "127.9.9.3:3333"]'
        in chief["chief:0"].env["TF_CONFIG"]
    )
    single = ctx(tmp_path, "algo-1", opts, hosts=["algo-1"])
    specs = tf_parameter_server.plan(single, picker())
    assert [s.name for s in specs] == ["user"] and "TF_CONFIG" not in specs[0].env
    assert any("single instance" in n for n in single.notes)


def test_mwms_byte_exact(tmp_path):
    opts = {"enabled": True, "kind": "multi_worker_mirrored_strategy"}
    specs = by_name(multi_worker_mirrored.plan(ctx(tmp_path, "algo-2", opts), picker()))
    assert specs["user"].env["TF_CONFIG"] == (
        '{"cluster": {"worker": ["127.9.9.1:8890", "127.9.9.2:40001", "127.9.9.3:8890"]}, '
        '"environment": "cloud", "task": {"index": 1, "type": "worker"}}'
    )
    relay = specs["relay-worker:1"]
    assert relay.role == "service" and "--serve" not in relay.argv
    assert "worker:1=127.9.9.2:8890>127.9.9.2:40001" in relay.argv
    assert json.loads(specs["user"].env["TF_CONFIG"])["task"] == {"index": 1, "type": "worker"}
    # the Keras 3 model.fit fix is loaded into the script's process (shipyard.tf.keras_compat)
    assert specs["user"].env["SHIPYARD_KERAS_MWMS_COMPAT"] == "1"
    path = specs["user"].env["PYTHONPATH"].split(os.pathsep)
    assert path[:2] == ["/code", "/resolver"]
    assert path[2].endswith(os.path.join("shipyard", "tf", "_hook"))
    single = by_name(
        multi_worker_mirrored.plan(ctx(tmp_path, "algo-1", opts, hosts=["algo-1"]), picker())
    )
    assert "SHIPYARD_KERAS_MWMS_COMPAT" not in single["user"].env  # one worker: nothing to fix


@pytest.mark.parametrize(
    "options, message",
    [
        ({"processes_per_host": 2}, "one worker per host"),
        ({"layout": "tf3"}, "'tf2'"),
        ({"ports": {"ps": 2222, "chief": 2222}}, "different ports"),
        ({"ports": {"ps": 2224}}, "both use port 2224"),
        ({"ports": {"master": 1}}, "no role 'master' in the 'tf2' layout"),
        ({"ports": {"ps": 70000}}, "TCP port"),
        ({"sync": True}, "unknown distribution['parameter_server'] key(s) ['sync']"),
    ],
)
def test_bad_ps_options(options, message):
    import re

    from shipyard.errors import DistributionError

    with pytest.raises(DistributionError, match=re.escape(message)):
        tf_parameter_server.TFParameterServerRunner().validate(
            {"enabled": True, **options}, 2, None
        )


def test_bad_mwms_options():
    from shipyard.errors import DistributionError

    with pytest.raises(DistributionError, match="unknown"):
        multi_worker_mirrored.MWMSRunner().validate({"enabled": True, "ports": 1}, 2, None)
    with pytest.raises(DistributionError, match="TCP port"):
        multi_worker_mirrored.MWMSRunner().validate({"enabled": True, "port": "x"}, 2, None)


def test_tensorflow_missing_names_the_extra(tmp_path):
    """In an interpreter where tensorflow cannot be found, submission names the extra."""
    import subprocess
    import sys

    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'tf_keras'): raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from shipyard.agent.runners import tf_parameter_server as r\n"
        "try:\n    r.TFParameterServerRunner().validate({'enabled': True}, 2, None)\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True
    ).stdout
    assert "DistributionError" in out and "shipyard[tensorflow]" in out
