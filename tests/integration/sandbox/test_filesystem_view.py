"""Issue 31, the filesystem: an instance sees the whole system read-only behind a writable
layer thrown away with it, its own /tmp and /dev, and the host paths its spec names.

A real job whose script writes where scripts do (``/usr/local``, ``/var``, a new top-level
directory, ``/tmp``), tries what an attacker would (the host's disks, its cgroup files,
sysctls, a walk up from its working directory) and uses a directory the test hands it;
the test then checks the host: nothing landed, the named directory got its file.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import uuid

import pytest

import shipyard
from shipyard.control.disk_full import NO_VOLUME
from shipyard.sandbox import probe

pytestmark = pytest.mark.skipif(
    not probe.support().ok, reason=f"no instance sandbox here: {probe.support().reason}"
)

SCRIPT = r"""
import glob, json, os, tempfile
out = {}
def attempt(fn):
    try:
        return fn()
    except OSError as exc:
        return type(exc).__name__ + ":" + str(exc.errno)
def write(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("probe")
    with open(path) as fh:
        return "written" if fh.read() == "probe" else "lost"
tag = os.environ["TAG"]
out["usr_local"] = attempt(lambda: write(f"/usr/local/shipyard-probe-{tag}/x"))
out["var"] = attempt(lambda: write(f"/var/shipyard-probe-{tag}"))
out["new_top"] = attempt(lambda: write(f"/shipyard-probe-{tag}/x"))
out["tmp"] = attempt(lambda: write(f"/tmp/shipyard-probe-{tag}"))
out["tmpdir"] = [os.environ.get("TMPDIR"), tempfile.gettempdir()]
out["marker"] = attempt(lambda: write(os.path.join(os.environ["MARKER_DIR"], "from-job")))
secret = os.environ["SECRET"].split("=", 1)[1]  # not path-like: the view does not keep it
out["host_tmp_secret"] = attempt(lambda: open(secret).read())
out["host_tmp_listing"] = attempt(lambda: sorted(os.listdir("/tmp")))
# the walk up from the working directory stays inside the view
out["cwd"] = os.getcwd()
out["walk_up_tmp"] = attempt(lambda: os.listdir("../../../tmp"))
out["dev"] = sorted(os.listdir("/dev"))
out["dev_null"] = attempt(lambda: open("/dev/null", "w").write("x"))
procs = sorted(glob.glob("/sys/fs/cgroup/*/cgroup.procs") + glob.glob("/sys/fs/cgroup/cgroup.procs"))
out["cgroup_procs"] = attempt(lambda: open(procs[0], "w").write("1"))
out["sysctl"] = attempt(lambda: open("/proc/sys/vm/drop_caches", "w").write("1"))
with open("/opt/ml/model/fs.json", "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.timeout(120)
def test_writes_land_in_a_throw_away_layer_and_named_paths_stay_the_hosts(
    session, write_script, tmp_path
):
    tag = uuid.uuid4().hex[:8]
    markers = tmp_path / "markers"
    markers.mkdir()
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret")
    est = shipyard.Estimator(
        entry_point="fs.py",
        source_dir=write_script("fs.py", SCRIPT),
        instance_count=1,
        instance_type="local",
        environment={"TAG": tag, "MARKER_DIR": str(markers), "SECRET": f"path={secret}"},
        session=session,
    )
    try:
        est.fit(job_name="fs-layer")
        with tarfile.open(est.model_data.removeprefix("file://")) as tar:
            record = json.load(tar.extractfile("fs.json"))
        # the writes ran and went nowhere on the host
        assert record["usr_local"] == record["var"] == record["new_top"] == "written", record
        assert record["tmp"] == "written", record
        assert record["tmpdir"] == [None, "/tmp"]  # /tmp is its own, as on SageMaker
        for path in (
            f"/usr/local/shipyard-probe-{tag}",
            f"/var/shipyard-probe-{tag}",
            f"/shipyard-probe-{tag}",
            f"/tmp/shipyard-probe-{tag}",
        ):
            assert not os.path.exists(path), path
        # the directory the spec named is the host's, writable
        assert record["marker"] == "written" and (markers / "from-job").read_text() == "probe"
        # the rest of the host's /tmp is not there, whichever way it is looked for
        assert record["host_tmp_secret"] == "FileNotFoundError:2", record
        assert f"shipyard-probe-{tag}" in record["host_tmp_listing"]
        assert record["cwd"] == "/opt/ml/code"
        assert secret.name not in str(record["walk_up_tmp"]), record
        # a /dev of its own: no disk of the host's, the usual devices work
        assert not [d for d in record["dev"] if d.startswith(("vd", "sd", "nvme", "loop"))]
        assert {"null", "zero", "urandom", "pts", "shm"} <= set(record["dev"])
        assert record["dev_null"] == 1
        # the host's cgroup files and the kernel's settings are read-only
        assert record["cgroup_procs"] == "OSError:30", record  # EROFS
        assert record["sysctl"] == "OSError:30", record
        missing = est.latest_training_job.describe()["Shipyard"]["MissingProtections"]
        assert [m for m in missing if m["Missing"] != NO_VOLUME] == []  # but the disk
    finally:  # only when the test failed is there anything: keep the host clean
        for path in (f"/usr/local/shipyard-probe-{tag}", f"/shipyard-probe-{tag}"):
            shutil.rmtree(path, ignore_errors=True)
        for path in (f"/var/shipyard-probe-{tag}", f"/tmp/shipyard-probe-{tag}"):
            if os.path.exists(path):
                os.unlink(path)
