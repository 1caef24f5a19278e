"""Issue 31 on Ray: a Ray instance is contained as a local one is, on every node.

Its processes run in the instance's own PID namespace (an init that reaps), without
capabilities and with no_new_privs, in the filesystem view the local backend gives
(shipyard.sandbox.fsview); the node's work dir (other jobs' instances and secrets) and
the submitter's ``$SHIPYARD_HOME`` are not there. A protection a node cannot give is named
in the instance's log and in describe's MissingProtections (the job still runs).
"""

from __future__ import annotations

import json
import os
import tarfile
import uuid

import pytest

from shipyard.agent.__main__ import NODE_NETWORK_ISOLATION_NOTE
from shipyard.control.job_disks import NOT_LOCAL
from shipyard.control.job_disks import missing_text as no_disk
from shipyard.sandbox import probe
from tests.integration.ray_backend.test_ray_backend import _assert_on_nodes

PROBE = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {"host": os.environ["SM_CURRENT_HOST"], "me": os.getpid()}
procs = {}
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    try:
        procs[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        pass
out["procs"] = procs
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
out["cap_eff"] = status["CapEff"].strip()
out["cap_bnd"] = status["CapBnd"].strip()
out["no_new_privs"] = status["NoNewPrivs"].strip()
def setns(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return "open:" + errno.errorcode[exc.errno]
    return "entered" if libc.setns(fd, 0x40000000) == 0 else errno.errorcode[ctypes.get_errno()]
out["setns_net"] = setns("/proc/1/ns/net")
out["setns_own_net"] = setns("/proc/self/ns/net")
def seen(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return errno.errorcode[exc.errno]
out["home"] = seen(os.environ["PROBE_HOME"])
out["workdir"] = seen(os.environ["PROBE_WORKDIR"])
try:
    with open(os.environ["PROBE_ETC"], "w") as fh:
        fh.write("x")
    out["etc"] = "written"
except OSError as exc:
    out["etc"] = errno.errorcode[exc.errno]
os.makedirs("/opt/ml/model", exist_ok=True)
with open(f"/opt/ml/model/{out['host']}.json", "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.timeout(240)
def test_a_ray_instance_sees_only_itself_and_holds_no_privilege(
    ray_session, ray_cluster, write_script, home
):
    import shipyard

    if not probe.support(network=False).ok:
        pytest.skip(f"no namespaces here: {probe.support(network=False).reason}")
    etc_file = f"/etc/shipyard-ray-probe-{uuid.uuid4().hex[:12]}"
    est = shipyard.Estimator(
        entry_point="probe.py",
        source_dir=write_script("probe.py", PROBE),
        instance_count=2,
        instance_type="local",
        environment={
            "PROBE_HOME": str(home),
            "PROBE_WORKDIR": ray_cluster.workdir,
            "PROBE_ETC": etc_file,
        },
        enable_network_isolation=True,  # not enforceable on Ray: must be said, not hidden
        session=ray_session,
    )
    est.fit(job_name="ray-isolation")
    desc = est.latest_training_job.describe()
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        records = {
            m.name: json.load(tar.extractfile(m))  # type: ignore[arg-type]
            for m in tar.getmembers()
            if m.isfile()
        }
    assert sorted(records) == ["algo-1.json", "algo-2.json"]
    missing = desc["Shipyard"]["MissingProtections"]
    for host in ("algo-1", "algo-2"):
        record = records[f"{host}.json"]
        # its own PID namespace: init is pid 1, and no process of the node (raylet, the
        # keeper, the agent, the other instance's script) is listed
        procs = record["procs"]
        assert "instance-init" in procs["1"] or "init.py" in procs["1"], procs
        listed = " ".join(procs.values())
        for outsider in ("raylet", "shipyard.backends.ray.keeper", "shipyard.agent", "gcs"):
            assert outsider not in listed, procs
        assert len(procs) < 10, procs
        # no capability, none to gain: setns into a namespace fails
        assert int(record["cap_eff"], 16) == 0 and int(record["cap_bnd"], 16) == 0
        assert record["no_new_privs"] == "1"
        assert record["setns_net"] in ("EPERM", "open:EACCES"), record["setns_net"]
        assert record["setns_own_net"] == "EPERM"  # even its own: no CAP_SYS_ADMIN
        # the submitter's home and the node's other jobs are not there; its /etc layer
        # is its own
        assert record["home"] in ([], "ENOENT"), record["home"]
        assert record["workdir"] == ["ray-isolation"], record["workdir"]
        assert record["etc"] == "written"
    assert not os.path.exists(etc_file)  # the instance's /etc layer went with it
    # what the nodes could not give is said, not hidden: here only network isolation,
    # in describe and in every instance's log
    assert missing == [
        entry
        for h in ("algo-1", "algo-2")
        for entry in (
            {"Host": h, "Missing": no_disk(NOT_LOCAL.format(backend="ray"))},
            {"Host": h, "Missing": NODE_NETWORK_ISOLATION_NOTE},
        )
    ]
    for instance in desc["Shipyard"]["Instances"]:
        with open(instance["LogPath"], encoding="utf-8") as fh:
            assert f"protection missing: {NODE_NETWORK_ISOLATION_NOTE}" in fh.read()
    _assert_on_nodes(ray_session, ray_cluster)


LIMITS = r"""
import json, os
limit = None
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.strip().split(":", 2)
    for candidate in (f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes",
                      f"/sys/fs/cgroup/unified{path}/memory.max",
                      f"/sys/fs/cgroup{path}/memory.max"):
        if ("memory" in controllers.split(",") or controllers == "") and os.path.exists(candidate):
            value = open(candidate).read().strip()
            if value != "max" and (limit is None or int(value) < limit):
                limit = int(value)
os.makedirs("/opt/ml/model", exist_ok=True)
with open("/opt/ml/model/limits.json", "w") as fh:
    json.dump({"memory": limit, "cpus": sorted(os.sched_getaffinity(0))}, fh)
"""


@pytest.mark.timeout(240)
def test_a_ray_instance_of_a_named_type_gets_its_types_memory_limit_on_its_node(
    ray_session, ray_cluster, write_script
):
    """Ray's accounting places the instance (2 CPUs for ml.m5.large); its node's cgroup
    holds it to the type's memory, and describe says what it got and on which node."""
    import shipyard
    from shipyard import instance_types
    from shipyard.sandbox import cgroups

    hierarchy = cgroups.detect()
    if not hierarchy.usable:
        pytest.skip(f"no usable cgroups here: {hierarchy.reason}")
    est = shipyard.Estimator(
        entry_point="limits.py",
        source_dir=write_script("limits.py", LIMITS),
        instance_count=1,
        instance_type="ml.m5.large",
        session=ray_session,
    )
    est.fit(job_name="ray-limits")
    memory = instance_types.resolve("ml.m5.large").memory_bytes
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        got = json.load(tar.extractfile("limits.json"))  # type: ignore[arg-type]
    assert got["memory"] == memory
    resources = est.latest_training_job.describe()["Shipyard"]["Resources"]
    address = est.latest_training_job.describe()["Shipyard"]["Instances"][0]["Address"]
    instance = resources["Instances"]["algo-1"]
    assert instance["MemoryBytes"] == memory and instance["Node"] == address
    assert instance["Cpus"] == got["cpus"]
    assert resources["InstanceType"] == "ml.m5.large" and resources["Cgroups"]
    _assert_on_nodes(ray_session, ray_cluster)
