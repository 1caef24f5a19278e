"""Pure parts of an instance's share of the machine: memory per type, CPU sets, GPU
division (enough, too few, none, held by another job), leases, the utilization parser."""

from __future__ import annotations

import os
import subprocess

import pytest

from shipyard import instance_types
from shipyard.backends import resources
from shipyard.observe import utilization
from shipyard.sandbox import cgroups, gpus

GIB = 1 << 30


@pytest.mark.parametrize(
    ("name", "gib"),
    [
        ("ml.m5.large", 8),
        ("ml.m5.xlarge", 16),
        ("ml.c5.xlarge", 8),
        ("ml.r5.large", 16),
        ("ml.t3.medium", 4),
        ("ml.p3.2xlarge", 61),
        ("ml.g5.12xlarge", 192),
    ],
)
def test_memory_per_type_is_sagemakers(name, gib):
    assert instance_types.nominal_memory(name) == gib * GIB
    res = instance_types.resolve(name)
    assert res.memory_bytes == min(gib * GIB, instance_types.machine_memory())


def test_local_types_have_no_memory_limit():
    assert instance_types.nominal_memory("local") is None
    assert instance_types.resolve("local_gpu").memory_bytes is None
    assert instance_types.resolve("local").whole_machine


def test_cpu_sets_are_disjoint_while_the_machine_has_enough_then_wrap():
    assert cgroups.cpu_sets(2, 3, list(range(8))) == [(0, 1), (2, 3), (4, 5)]
    assert cgroups.cpu_sets(4, 3, list(range(8))) == [(0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 2, 3)]
    assert cgroups.cpu_sets(16, 2, [0, 1]) == [(0, 1), (0, 1)]  # capped to the machine
    assert cgroups.cpu_sets(2, 2, [3, 5, 7]) == [(3, 5), (3, 7)]
    assert cgroups.cpu_sets(2, 2, []) == [(), ()]


def test_cpu_list_is_the_kernels_format():
    assert cgroups.cpu_list((0, 1, 2, 3, 6, 8, 9)) == "0-3,6,8-9"
    assert cgroups.cpu_list((5,)) == "5"


HOSTS = ["algo-1", "algo-2"]


def test_gpus_enough_each_instance_gets_its_types_count():
    div = gpus.divide(HOSTS, 4, [str(i) for i in range(8)], instance_type="ml.p3.8xlarge")
    assert div.gpus == {"algo-1": ["0", "1", "2", "3"], "algo-2": ["4", "5", "6", "7"]}
    assert div.notes == [] and div.blocked == {}


def test_gpus_too_few_an_even_share_said_once():
    div = gpus.divide(HOSTS, 4, ["0", "1", "2", "3"], instance_type="ml.p3.8xlarge")
    assert div.gpus == {"algo-1": ["0", "1"], "algo-2": ["2", "3"]}
    assert len(div.notes) == 1 and "each instance gets 2" in div.notes[0]
    one = gpus.divide(HOSTS, 1, ["0"], instance_type="ml.p3.2xlarge")
    assert one.gpus == {"algo-1": ["0"], "algo-2": ["0"]}
    assert "share a GPU" in one.notes[0]


def test_gpus_none_run_on_cpu():
    div = gpus.divide(HOSTS, 1, [], instance_type="ml.p3.2xlarge")
    assert div.gpus == {"algo-1": [], "algo-2": []}
    assert "run on CPU" in div.notes[0] and div.blocked == {}


def test_gpu_held_by_another_job_waits_by_default_or_is_shared_with_consent():
    held = {"0": "job other (pid 1)"}
    wait = gpus.divide(HOSTS, 1, ["0", "1"], held, instance_type="ml.p3.2xlarge")
    assert wait.blocked == held and wait.gpus == {"algo-1": [], "algo-2": []}
    share = gpus.divide(HOSTS, 1, ["0", "1"], held, gpus.SHARE, "ml.p3.2xlarge")
    assert share.gpus == {"algo-1": ["0"], "algo-2": ["1"]} and not share.blocked
    assert "held by job other" in share.notes[0]
    # enough free GPUs left: the held one is simply not used
    free = gpus.divide(["algo-1"], 1, ["0", "1"], held, instance_type="ml.p3.2xlarge")
    assert free.gpus == {"algo-1": ["1"]} and not free.blocked


def test_gpu_list_seam_and_policy(monkeypatch):
    monkeypatch.setenv("SHIPYARD_GPUS", "0, 1,2")
    assert gpus.devices() == ["0", "1", "2"]
    monkeypatch.setenv("SHIPYARD_GPUS", "none")
    assert gpus.devices() == []
    monkeypatch.setenv("SHIPYARD_GPU_SHARING", "sometimes")
    with pytest.raises(ValueError, match="wait, share"):
        gpus.sharing_policy()


def test_leases_are_held_while_their_process_lives(tmp_path):
    directory = str(tmp_path / "leases")
    taken = gpus.take(["0", "1"], "job-a", directory)
    mine = f"job job-a (pid {os.getpid()})"
    assert len(taken) == 2 and gpus.held(directory) == {"0": mine, "1": mine}
    assert gpus.take(["1"], "job-b", directory) == []  # already leased: not taken twice
    gpus.give_back(taken)
    assert gpus.held(directory) == {}
    gone = subprocess.Popen(["true"])
    gone.wait()
    with open(os.path.join(directory, "3"), "w") as fh:
        fh.write(f"{gone.pid} job-dead\n")
    assert gpus.held(directory) == {}  # its process is gone: the lease is free
    assert not os.path.exists(os.path.join(directory, "3"))


def test_plan_named_type_gets_cpusets_memory_gpus():
    plan = resources.plan(
        instance_types.resolve("ml.p3.8xlarge"),
        HOSTS,
        available_cpus=list(range(64)),
        available_gpus=["0", "1"],
    )
    assert plan.limits["algo-1"].cpus == tuple(range(32))
    assert plan.limits["algo-2"].cpus == tuple(range(32, 64))
    assert plan.limits["algo-1"].memory_bytes == min(244 * GIB, instance_types.machine_memory())
    assert plan.division.gpus == {"algo-1": ["0"], "algo-2": ["1"]}
    local = resources.plan(
        instance_types.resolve("local"), HOSTS, available_cpus=[0, 1], available_gpus=["0"]
    )
    assert local.limits["algo-1"].cpus == () and local.limits["algo-1"].memory_bytes is None
    assert local.limits["algo-1"].pids_max == resources.PIDS_MAX_DEFAULT
    assert local.division.gpus == {"algo-1": [], "algo-2": []}
    everything = resources.plan(
        instance_types.resolve("local_gpu"), HOSTS, available_cpus=[0], available_gpus=["0", "1"]
    )
    assert everything.division.gpus == {"algo-1": ["0", "1"], "algo-2": ["0", "1"]}


def test_unlimited_is_said_with_its_reason_and_fix():
    plan = resources.plan(
        instance_types.resolve("ml.m5.large"), HOSTS, available_cpus=[0, 1], available_gpus=[]
    )
    none = cgroups.Hierarchy(0, reason="cgroup v1 and this user may not", fix="run as root")
    lines = plan.summary(none)
    assert any(
        "without CPU, memory and process limits" in ln and "run as root" in ln for ln in lines
    )
    record = plan.record(none)
    assert record["Cgroups"] is None and record["Unlimited"].startswith("cgroup v1")


def test_oom_reason_names_host_limit_and_type():
    assert resources.oom_reason("algo-2", "ml.m5.large", 8 * GIB).startswith(
        "OutOfMemoryError: algo-2 exceeded its 8 GiB memory limit (ml.m5.large)"
    )


def test_nvidia_smi_table_parses_and_skips_unavailable_rows():
    text = "0, 87, 4000, 16000\n1, [N/A], 0, 16000\n2, 10, 8000, 16000\n"
    assert utilization.parse_gpu_table(text) == {"0": (87.0, 25.0), "2": (10.0, 50.0)}


def test_utilization_points_shape():
    samples = [{"Timestamp": 1.0, "Host": "algo-1", "CPUUtilization": 50.0, "MemoryBytes": 9}]
    assert utilization.points(samples) == [
        {"name": "CPUUtilization", "value": 50.0, "at": 1.0, "host": "algo-1"},
        {"name": "MemoryBytes", "value": 9, "at": 1.0, "host": "algo-1"},
    ]
    assert utilization.by_host(samples) == {
        "algo-1": [{"Timestamp": 1.0, "CPUUtilization": 50.0, "MemoryBytes": 9}]
    }


def test_doctor_names_the_cgroup_check_and_its_fix(monkeypatch):
    from shipyard.cli.doctor import checks

    monkeypatch.setenv("SHIPYARD_CGROUPS", "off")
    found = {c.name: c for c in checks()}["instance resources (cgroups)"]
    assert not found.ok and "SHIPYARD_CGROUPS=off" in found.detail
    assert found.fix == "unset SHIPYARD_CGROUPS"
    monkeypatch.delenv("SHIPYARD_CGROUPS")
    assert {c.name: c for c in checks()}["instance resources (cgroups)"].ok == (
        cgroups.detect().usable
    )


def test_a_bad_sharing_setting_refuses_the_launch_saying_what_to_use(monkeypatch, tmp_path):
    from shipyard.errors import BackendError

    monkeypatch.setenv("SHIPYARD_GPU_SHARING", "maybe")
    with pytest.raises(BackendError, match="wait, share"):
        resources.allot(
            instance_types.resolve("ml.m5.large"),
            HOSTS,
            "job",
            str(tmp_path),
            str(tmp_path / "logs" / "algo-1.log"),
        )
    assert not (tmp_path / "resources.json").exists()
