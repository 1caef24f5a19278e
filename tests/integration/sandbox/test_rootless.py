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

from shipyard.control.job_disks import missing_text as no_disk
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


PROBE = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def attempt(fn):
    try:
        return fn()
    except OSError as exc:
        return errno.errorcode[exc.errno]
def setns(path):
    fd = os.open(path, os.O_RDONLY)
    return "entered" if libc.setns(fd, 0x40000000) == 0 else errno.errorcode[ctypes.get_errno()]
def write(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("probe")
    return "written"
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["me"] = os.getpid()
out["host_pid"] = attempt(lambda: os.kill(int(os.environ["HOST_PID"]), 0))
out["setns_init"] = attempt(lambda: setns("/proc/1/ns/net"))
out["setns_host"] = attempt(lambda: setns(f"/proc/{os.environ['HOST_PID']}/ns/net"))
path = lambda name: os.environ[name].split("=", 1)[1]
out["other_job"] = attempt(lambda: open(path("OTHER_JOB")).read())
out["home_secret"] = attempt(lambda: open(path("HOME_SECRET")).read())
out["etc"] = attempt(lambda: write(os.environ["ETC_PROBE"]))
out["usr_local"] = attempt(lambda: write(os.environ["USR_PROBE"]))
out["keras"] = attempt(lambda: write(os.path.expanduser("~/.keras/probe.json")))
with open("/opt/ml/model/probe.json", "w") as fh:
    json.dump(out, fh)
"""

SUBMIT_PROBE = r"""
import json, sys, shipyard
work = sys.argv[1]
env = json.loads(sys.argv[2])
e = shipyard.Estimator(entry_point="probe.py", source_dir=work + "/src", instance_count=1,
                       instance_type="local", environment=env,
                       session=shipyard.Session(home=work + "/home"))
e.fit(job_name="rootless-probe")
print("MODEL", e.model_data)
print("MISSING", json.dumps(e.latest_training_job.describe()["Shipyard"]["MissingProtections"]))
"""


@pytest.mark.timeout(180)
def test_isolation_holds_for_an_unprivileged_user(unprivileged_user):
    """Rootless (a user namespace of the job's own): /proc lists only the instance's
    processes, setns() into the instance's or a host namespace fails, the user's home
    and $SHIPYARD_HOME beyond the job are not there, writes to ~ run and vanish, and
    writes to /etc and /usr/local never reach the host."""
    import uuid

    work = tempfile.mkdtemp(prefix="shipyard-rootless-")
    tag = uuid.uuid4().hex[:8]
    etc_probe, usr_probe = f"/etc/shipyard-probe-{tag}", f"/usr/local/shipyard-probe-{tag}"
    try:
        os.makedirs(f"{work}/src")
        os.makedirs(f"{work}/.interpreter")
        os.makedirs(f"{work}/home/jobs/other")
        with open(f"{work}/home/jobs/other/agent.json", "w") as fh:
            fh.write('{"job_secret": "s3cret"}')
        with open(f"{work}/secret.txt", "w") as fh:
            fh.write("the user's own")
        with open(f"{work}/src/probe.py", "w") as fh:
            fh.write(PROBE)
        with open(f"{work}/submit.py", "w") as fh:
            fh.write(SUBMIT_PROBE)
        for d, _, files in os.walk(work):
            for p in [d] + [os.path.join(d, f) for f in files]:
                os.chown(p, unprivileged_user.pw_uid, unprivileged_user.pw_gid)
        os.chmod(work, 0o700)
        env = {
            "HOST_PID": str(os.getpid()),
            # not path-like: paths the spec names are kept in the view on purpose
            "OTHER_JOB": f"path={work}/home/jobs/other/agent.json",
            "HOME_SECRET": f"path={work}/secret.txt",
            "ETC_PROBE": etc_probe,
            "USR_PROBE": usr_probe,
        }
        argv = _as_user(unprivileged_user, work)
        argv.append(json.dumps(env))
        done = subprocess.run(argv, capture_output=True, text=True)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "instance sandbox off" not in out, out
        missing = json.loads(out.split("MISSING ", 1)[1].splitlines()[0])
        # but the disk of VolumeSizeInGB: a user without root cannot mount one (issue 37)
        disks = [m for m in missing if m["Missing"].startswith("no disk of VolumeSizeInGB")]
        assert [m for m in missing if m not in disks] == [], out
        assert [m["Missing"] for m in disks] == [
            no_disk(
                "shipyard runs as a user without root, who cannot attach and mount a disk image"
            )
        ], out
        model = out.split("MODEL ", 1)[1].split()[0].removeprefix("file://")
        with tarfile.open(model) as tar:
            rec = json.load(tar.extractfile("probe.json"))
        assert 1 in rec["pids"] and rec["me"] in rec["pids"] and len(rec["pids"]) < 6, rec
        assert rec["host_pid"] == "ESRCH", rec
        assert rec["setns_init"] in ("EPERM", "EACCES"), rec  # setns, or opening the ns file
        assert rec["setns_host"] == "ENOENT", rec  # no such pid in the instance's /proc
        assert rec["other_job"] == "ENOENT" and rec["home_secret"] == "ENOENT", rec
        # the host's /etc is root's: written into the throw-away layer where the kernel
        # lets the user write (as root), refused otherwise; never on the host either way
        assert rec["etc"] in ("written", "EACCES") and rec["usr_local"] in ("written", "EACCES")
        assert not os.path.exists(etc_probe) and not os.path.exists(usr_probe)
        assert rec["keras"] == "written" and not os.path.exists(f"{work}/.keras"), rec
    finally:
        for path in (etc_probe, usr_probe):
            if os.path.exists(path):
                os.unlink(path)
        shutil.rmtree(work, ignore_errors=True)
