"""Issue 31: an instance cannot open the GPUs it was not given (cgroup v1 ``devices``).

No GPU is needed: the machine's GPU list is the seam's (``SHIPYARD_GPUS``), and the
devices are character nodes with NVIDIA's major number made with mknod in the test's
directory. With no driver behind them, opening one fails with ENXIO; denied by the
instance's device cgroup it fails earlier, with EPERM: the kernel's own check, told apart.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

import shipyard
from shipyard import instance_types
from shipyard.backends import resources
from shipyard.sandbox import cgroups, gpus, probe

ROOT = os.geteuid() == 0


def _node(path: str, minor: int) -> str:
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(gpus.NVIDIA_MAJOR, minor))
    return path


@pytest.mark.skipif(not ROOT, reason="mknod needs root")
def test_rules_take_the_nodes_numbers_else_the_index(tmp_path):
    _node(str(tmp_path / "nvidia1"), 7)  # a node whose minor is not its index
    assert gpus.device_rules(["1", "2", "GPU-3b9c"], dev_dir=str(tmp_path)) == [
        "c 195:7 rwm",
        "c 195:2 rwm",
    ]


def test_each_named_instance_is_denied_the_gpus_it_was_not_given():
    machine = ["0", "1", "2", "3"]
    plan = resources.plan(
        instance_types.resolve("ml.p3.2xlarge"), ["algo-1", "algo-2"], [0, 1], machine
    )
    assert plan.division.gpus == {"algo-1": ["0"], "algo-2": ["1"]}
    denied = {h: lim.denied_devices for h, lim in plan.limits.items()}
    assert denied["algo-1"] == tuple(gpus.device_rules(["1", "2", "3"]))
    assert denied["algo-2"] == tuple(gpus.device_rules(["0", "2", "3"]))
    cpu = resources.plan(instance_types.resolve("ml.m5.large"), ["algo-1"], [0, 1], machine)
    assert cpu.limits["algo-1"].denied_devices == tuple(gpus.device_rules(machine))
    for whole in ("local", "local_gpu"):  # the whole machine: nothing denied
        plan = resources.plan(instance_types.resolve(whole), ["algo-1", "algo-2"], [0, 1], machine)
        assert all(not lim.denied_devices for lim in plan.limits.values())
    assert not any(
        lim.denied_devices
        for lim in resources.plan(
            instance_types.resolve("ml.p3.2xlarge"), ["algo-1"], [0, 1], []
        ).limits.values()
    )


def test_cgroup_v2_says_the_devices_are_not_denied():
    note = cgroups.devices_note(cgroups.Hierarchy(2, {"unified": "/sys/fs/cgroup"}))
    assert note is not None and "BPF" in note and "CUDA_VISIBLE_DEVICES" in note
    v1 = cgroups.Hierarchy(1, {"memory": "/m", "devices": "/d"})
    assert cgroups.devices_note(v1) is None and cgroups.denies_devices(v1)


OPENS = r"""
import errno, json, os
d = os.environ["NODES"]
seen = {}
for name in sorted(os.listdir(d)):
    try:
        os.close(os.open(os.path.join(d, name), os.O_RDWR))
        seen[name] = "opened"
    except OSError as exc:
        seen[name] = errno.errorcode[exc.errno]
out = {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "open": seen}
with open(os.path.join(os.environ["SM_MODEL_DIR"], os.environ["SM_CURRENT_HOST"]), "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.skipif(not ROOT, reason="mknod and cgroup v1 need root")
@pytest.mark.skipif(
    not cgroups.denies_devices(cgroups.detect()), reason="no cgroup v1 devices controller here"
)
@pytest.mark.skipif(not probe.support().ok, reason=f"no sandbox: {probe.support().reason}")
@pytest.mark.timeout(120)
def test_an_instance_cannot_open_another_instances_gpu(
    session, write_script, tmp_path, monkeypatch
):
    """Two ml.p3.2xlarge instances on a 2-GPU machine: each opens its own GPU's node as far
    as a node without a driver goes (ENXIO) and is refused the other's (EPERM)."""
    monkeypatch.setenv("SHIPYARD_GPUS", "0,1")
    monkeypatch.setenv("SHIPYARD_GPU_LEASES", str(tmp_path / "leases"))
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    for minor in (0, 1):
        _node(str(nodes / f"nvidia{minor}"), minor)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", OPENS),
        instance_count=2,
        instance_type="ml.p3.2xlarge",
        environment={"NODES": str(nodes)},
        session=session,
    )
    est.fit(job_name="gpu-devices", logs=False)
    job_dir = est.latest_training_job.describe()["Shipyard"]["JobDir"]
    seen = {}
    for host in ("algo-1", "algo-2"):
        with open(os.path.join(job_dir, "instances", host, "model", host)) as fh:
            seen[host] = json.load(fh)
    assert seen["algo-1"] == {"cuda": "0", "open": {"nvidia0": "ENXIO", "nvidia1": "EPERM"}}
    assert seen["algo-2"] == {"cuda": "1", "open": {"nvidia0": "EPERM", "nvidia1": "ENXIO"}}
    resources_record = est.latest_training_job.describe()["Shipyard"]["Resources"]
    assert resources_record["Instances"]["algo-1"]["DeniedDevices"] == ["c 195:1 rwm"]
