"""Issue 15, rootless: a 2-instance job submitted by an unprivileged user runs in instance
sandboxes (the user namespace path: the holder maps the user to root in a new user
namespace and the agents join it), with /opt/ml mapped, hostname algo-k, algo-k resolved
by libc, and nothing left behind.

Run as root (CI), the test creates an unprivileged user and runs the job as that user.
The shared venv's interpreter lives under /root (0700 here), so the user's process gets,
in a private mount namespace of its own, a /root that holds only .pyenv: nothing else of
the host changes, and the job itself sees the filesystem as that user does.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import tempfile

import pytest

from shipyard.sandbox import probe
from tests.conftest import job_processes

USER = "shipyard-rootless"

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="creating an unprivileged user needs root; run as a user, every sandbox "
        "test here already takes the rootless path",
    ),
    pytest.mark.skipif(not probe.support().ok, reason=f"no sandbox: {probe.support().reason}"),
]

TRAIN = r"""
import json, os, socket, subprocess
host = socket.gethostname()
record = {
    "host": host,
    "current_host": json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"],
    "getent": subprocess.run(["getent", "hosts", "algo-1", "algo-2"],
                             capture_output=True, text=True).stdout.split(),
    "model_dir": os.environ["SM_MODEL_DIR"],
}
os.makedirs("/opt/ml/model/1", exist_ok=True)
with open(f"/opt/ml/model/1/{host}.json", "w") as fh:
    json.dump(record, fh)
"""

SUBMIT = r"""
import sys, shipyard
work = sys.argv[1]
e = shipyard.Estimator(entry_point="train.py", source_dir=work + "/src", instance_count=2,
                       instance_type="local", session=shipyard.Session(home=work + "/home"))
e.fit(job_name="rootless")
print("MODEL", e.model_data)
"""


@pytest.fixture
def unprivileged_user():
    created = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", USER], check=True)
        created = True
    yield pwd.getpwnam(USER)
    if created:
        subprocess.run(["userdel", USER], check=False)


def _as_user(user: pwd.struct_passwd, work: str) -> list[str]:
    """argv running SUBMIT as ``user``; /root made traversable to it only in a private mount
    namespace when the interpreter lives there (a 0700 /root, as on this machine)."""
    python = os.path.join(os.path.dirname(sys.executable), "python")
    run = ["runuser", "-u", user.pw_name, "--", "env", f"HOME={work}"]
    run += [f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", python, f"{work}/submit.py", work]
    real = os.path.realpath(sys.executable)
    if not real.startswith("/root/") or os.stat("/root").st_mode & 0o005:
        return run
    top = "/root/" + real.split("/")[2]  # /root/.pyenv
    view = f"{work}/.interpreter"
    script = (
        f"mount --bind {top} {view} && mount -t tmpfs -o mode=755 tmpfs /root && "
        f'mkdir {top} && mount --bind {view} {top} && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *run]


@pytest.mark.timeout(180)
def test_two_instances_as_an_unprivileged_user(unprivileged_user):
    work = tempfile.mkdtemp(prefix="shipyard-rootless-")
    try:
        os.makedirs(f"{work}/src")
        os.makedirs(f"{work}/.interpreter")
        with open(f"{work}/src/train.py", "w") as fh:
            fh.write(TRAIN)
        with open(f"{work}/submit.py", "w") as fh:
            fh.write(SUBMIT)
        for d, _, files in os.walk(work):
            for p in [d] + [os.path.join(d, f) for f in files]:
                os.chown(p, unprivileged_user.pw_uid, unprivileged_user.pw_gid)
        os.chmod(work, 0o700)
        done = subprocess.run(_as_user(unprivileged_user, work), capture_output=True, text=True)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "instance sandbox off" not in out, out  # the sandbox ran, rootless
        model = out.split("MODEL ", 1)[1].split()[0].removeprefix("file://")
        assert os.stat(model).st_uid == unprivileged_user.pw_uid  # written as the user
        with tarfile.open(model) as tar:
            records = {
                m.name: json.load(tar.extractfile(m)) for m in tar.getmembers() if m.isfile()
            }
        assert sorted(records) == ["1/algo-1.json", "1/algo-2.json"]
        for name, rec in records.items():
            host = name[2:-5]
            assert rec["host"] == rec["current_host"] == host
            assert rec["model_dir"] == "/opt/ml/model"
            assert rec["getent"][1::2] == ["algo-1", "algo-2"]
        assert job_processes(os.path.join(work, "home", "jobs", "rootless")) == []
        with open("/proc/self/mountinfo") as fh:
            assert work not in fh.read()
    finally:
        shutil.rmtree(work, ignore_errors=True)
