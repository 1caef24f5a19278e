"""Issue 37, root causes 2-4: confinement comes before the job's environment, a seccomp
filter and an IPC namespace hold, /proc and the host's secrets are masked, no host Unix
socket answers.

One real job (network isolation on, as the attacks assumed) probes everything from inside
its instance; the tests share its answers. The driver runs in a private mount namespace
of its own (``unshare -m``) where it mounts a tmpfs on a new directory under /var/tmp and
another on /run, with a listening Unix socket in each: host mount points holding a
daemon's socket, as /run holds docker.sock and D-Bus on a systemd host. It also puts a
System V shared memory segment and a key in root's user keyring of the host, and hands
the job (through its Environment, as a user's adversary would) ``LD_PRELOAD`` of a
library that records the capabilities of every process it loads into.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from shipyard.sandbox import probe

pytestmark = [
    pytest.mark.skipif(
        not probe.support().ok, reason=f"no instance sandbox here: {probe.support().reason}"
    ),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None,
        reason="the host mount points with sockets need root and util-linux unshare",
    ),
]

PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void record(void) {
    char line[256], caps[64] = "?", exe[512] = {0};
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "CapEff:", 7)) sscanf(line + 7, "%63s", caps);
    if (f) fclose(f);
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) exe[0] = 0;
    const char *log = getenv("PRELOAD_LOG");
    FILE *o = log ? fopen(log, "a") : NULL;
    if (o) { fprintf(o, "%s %s\n", exe, caps); fclose(o); }
}
"""

PROBE = r"""
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.shmat.restype = ctypes.c_void_p
out = {}
def err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
out["seccomp"] = status["Seccomp"].strip()
out["caps"] = status["CapEff"].strip()
out["ld_preload"] = os.environ.get("LD_PRELOAD")
# a user namespace: the way to mount cgroup v1 hierarchies and raise one's own limits
pid = os.fork()
if pid == 0:
    os._exit(0 if libc.unshare(0x10000000) == 0 else 100 + ctypes.get_errno())
out["unshare_userns"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
# the keyring: root's user keyring is every root process's
key = libc.syscall(250, 0, -4, 0)  # KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING
out["keyctl"] = "ok" if key >= 0 else err()
desc = os.environ["PROBE_KEY"].encode()
found = libc.syscall(250, 10, -4, b"user", desc, 0)  # KEYCTL_SEARCH
out["host_key"] = "found" if found > 0 else err()
# System V shared memory of the host, and a segment that would outlive the job
sid = libc.shmget(int(os.environ["PROBE_SHM"]), 0, 0)
out["host_shm"] = "found" if sid >= 0 else err()
out["left_shm"] = libc.shmget(int(os.environ["PROBE_LEFT"]), 4096, 0o1000 | 0o600)
out["ipc_ns"] = os.readlink("/proc/self/ns/ipc")
# the host's daemons' sockets
def connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(path)
        s.sendall(b"job")
        return "connected"
    except OSError as exc:
        return type(exc).__name__ + ":" + (errno.errorcode.get(exc.errno) or "")
    finally:
        s.close()
out["sockets"] = {p: connect(p) for p in json.loads(os.environ["PROBE_SOCKETS"])}
out["run"] = sorted(os.listdir("/run"))
# runc's masked and read-only paths, the host's secrets
def read(path):
    try:
        with open(path, "rb") as fh:
            return len(fh.read(4096))
    except OSError as exc:
        return errno.errorcode.get(exc.errno)
out["read"] = {p: read(p) for p in ("/etc/shadow", "/proc/keys", "/proc/timer_list",
                                    "/proc/sched_debug")}
def rewrite(path):
    try:
        with open(path) as fh:
            same = fh.read()
        with open(path, "w") as fh:  # the value it holds: nothing changes if it works
            fh.write(same)
        return "written"
    except OSError as exc:
        return errno.errorcode.get(exc.errno)
out["irq"] = rewrite("/proc/irq/default_smp_affinity")
# what must keep working under the filter: threads (clone3 -> clone), fork, a shell
import subprocess, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["shell"] = subprocess.run(["/bin/sh", "-c", "echo ok"], capture_output=True, text=True).stdout
print("PROBE " + json.dumps(out), flush=True)
"""

# run in the driver's own mount namespace (unshare -m): nothing is mounted on the host
DRIVER = r"""
import ctypes, json, os, secrets, socket, subprocess, sys, tempfile, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.shmat.restype = ctypes.c_void_p
work, preload = sys.argv[1], sys.argv[2]
got = []
def serve(path):
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)
    srv.settimeout(120)
    def accept():
        try:
            while True:
                conn, _ = srv.accept()
                got.append(path)
                conn.close()
        except OSError:
            pass
    threading.Thread(target=accept, daemon=True).start()
    return path
mnt = tempfile.mkdtemp(prefix="shipyard-confine-", dir="/var/tmp")
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/run"], check=True)
sockets = [serve(os.path.join(mnt, "daemon.sock")), serve("/run/daemon.sock")]
token = secrets.token_hex(6)
shm_key = 0x73700000 + (os.getpid() & 0xffff)
left_key = 0x73710000 + (os.getpid() & 0xffff)
sid = libc.shmget(shm_key, 4096, 0o1000 | 0o600)
desc = f"shipyard-test-{token}".encode()
serial = libc.syscall(248, b"user", desc, b"secret", 6, -4)  # add_key to @u
try:
    import shipyard
    est = shipyard.PyTorch(
        entry_point="probe.py", source_dir=os.path.join(work, "src"), instance_count=1,
        instance_type="ml.c5.large", enable_network_isolation=True,
        environment={
            "LD_PRELOAD": preload, "PRELOAD_LOG": os.path.join(work, "preload", "log"),
            "PROBE_SOCKETS": json.dumps(sockets), "PROBE_SHM": str(shm_key),
            "PROBE_LEFT": str(left_key), "PROBE_KEY": desc.decode(),
        },
    )
    est.fit(job_name="confinement-probe", wait=True, logs=True)
finally:
    left = libc.shmget(left_key, 0, 0)
    for s in (sid, left):
        if s >= 0:
            libc.shmctl(s, 0, None)  # IPC_RMID
    if serial > 0:
        libc.syscall(250, 21, serial)  # KEYCTL_INVALIDATE
    subprocess.run(["umount", "-l", mnt])
    os.rmdir(mnt)
print("DRIVER " + json.dumps({"connected": got, "left_shm": left, "host_ipc": os.readlink("/proc/self/ns/ipc")}), flush=True)
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """The job's answers, the driver's (what reached its sockets, what outlived the
    job) and the preload log: (probe, driver, [(exe, CapEff)])."""
    work = tmp_path_factory.mktemp("confinement")
    (work / "src").mkdir()
    (work / "src" / "probe.py").write_text(PROBE)
    # under /tmp and named in the job's Environment: the job's own view has it too
    (work / "preload").mkdir()
    preload = ""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is not None:
        (work / "preload" / "p.c").write_text(PRELOAD_C)
        preload = str(work / "preload" / "p.so")
        subprocess.run(
            [cc, "-shared", "-fPIC", "-o", preload, str(work / "preload" / "p.c")],
            check=True,
            timeout=120,
        )
    (work / "driver.py").write_text(textwrap.dedent(DRIVER))
    env = dict(os.environ, SHIPYARD_HOME=str(work / "home"))
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, str(work / "driver.py")]
        + [str(work), preload],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    text = done.stdout + done.stderr
    probes = [line.split("PROBE ", 1)[1] for line in text.splitlines() if "PROBE {" in line]
    drivers = [line.split("DRIVER ", 1)[1] for line in text.splitlines() if "DRIVER {" in line]
    assert done.returncode == 0 and probes and drivers, text[-4000:]
    log = work / "preload" / "log"
    loads = (
        [tuple(line.rsplit(" ", 1)) for line in log.read_text().splitlines()]
        if log.exists()
        else []
    )
    return json.loads(probes[-1]), json.loads(drivers[-1]), loads, bool(preload)


@pytest.mark.timeout(300)
def test_ld_preload_of_the_job_loads_only_after_privileges_are_gone(probed):
    """Root cause 2: the job's environment is applied at the job's own exec; the
    launcher before it runs in a fixed environment of its own."""
    record, _, loads, compiled = probed
    if not compiled:
        pytest.skip("no C compiler for the preloaded library")
    assert loads, "the preloaded library never ran: the test proves nothing"
    privileged = [(exe, caps) for exe, caps in loads if int(caps, 16) != 0]
    assert privileged == [], privileged
    assert record["ld_preload"] and record["caps"] == "0000000000000000"


@pytest.mark.timeout(300)
def test_seccomp_refuses_user_namespaces_and_the_keyring(probed):
    record, _, _, _ = probed
    assert record["seccomp"] == "2"  # a filter is loaded
    assert record["unshare_userns"] == 100 + 1, record  # EPERM: no cgroup v1 mounts
    assert record["keyctl"] == "EPERM" and record["host_key"] == "EPERM", record
    assert record["shell"] == "ok\n"  # threads (clone3 -> clone), fork and exec still work


@pytest.mark.timeout(300)
def test_the_instance_has_its_own_ipc_namespace(probed):
    record, driver, _, _ = probed
    assert record["ipc_ns"] != driver["host_ipc"]
    assert record["host_shm"] == "ENOENT", record
    assert record["left_shm"] >= 0 and driver["left_shm"] < 0  # created, gone with it


@pytest.mark.timeout(300)
def test_no_host_unix_socket_answers_the_job(probed):
    """Root cause 4: a socket on a host mount point below / (here a tmpfs under
    /var/tmp) and one in the host's /run."""
    record, driver, _, _ = probed
    assert driver["connected"] == [], driver
    assert all(not v.startswith("connected") for v in record["sockets"].values()), record
    assert "daemon.sock" not in record["run"]


@pytest.mark.timeout(300)
def test_proc_and_the_hosts_secrets_are_masked(probed):
    record, _, _, _ = probed
    assert record["irq"] == "EROFS", record
    assert record["read"]["/etc/shadow"] == 0, record  # reads as empty
    assert record["read"]["/proc/keys"] in (0, "ENOENT"), record
    assert record["read"]["/proc/timer_list"] in (0, "ENOENT"), record
