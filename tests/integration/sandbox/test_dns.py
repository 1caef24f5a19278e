"""Issue 15, DNS: an instance resolves outside names through the host's resolver even when
that resolver listens on the host's loopback (systemd-resolved's 127.0.0.53), which an
instance's own network namespace cannot reach: pasta forwards the instance's DNS to it.

The test runs the job in a private mount namespace whose /etc/resolv.conf names a tiny UDP
DNS responder the test starts on a loopback address of the host (no internet, nothing
else of the machine changes)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading

import pytest

from shipyard.sandbox import probe, tools

pytestmark = [
    pytest.mark.skipif(not probe.support().ok, reason=f"no sandbox: {probe.support().reason}"),
    pytest.mark.skipif(tools.find("pasta") is None, reason="pasta (passt) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="binds port 53 and bind-mounts resolv.conf"),
]

RESOLVER = "127.0.0.77"  # on the host's loopback only
NAME = "outside.shipyard.test"
ANSWER = "192.0.2.55"


def _answer(query: bytes) -> bytes | None:
    """A one-record DNS answer for an A query of NAME (else NXDOMAIN)."""
    if len(query) < 12:
        return None
    qid, _flags, qd = struct.unpack("!HHH", query[:6])
    i, labels = 12, []
    while i < len(query) and query[i]:
        labels.append(query[i + 1 : i + 1 + query[i]].decode(errors="replace"))
        i += 1 + query[i]
    question = query[12 : i + 5]
    qtype = struct.unpack("!H", query[i + 1 : i + 3])[0]
    found = ".".join(labels).lower() == NAME and qtype == 1
    header = struct.pack("!HHHHHH", qid, 0x8180 if found else 0x8183, qd, int(found), 0, 0)
    if not found:
        return header + question
    record = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(ANSWER)
    return header + question + record


@pytest.fixture
def loopback_resolver():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((RESOLVER, 53))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(512)
            except OSError:
                continue
            reply = _answer(data)
            if reply:
                sock.sendto(reply, peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield RESOLVER
    stop.set()
    thread.join()
    sock.close()


SUBMIT = r"""
import sys, tarfile, shipyard
src, home = sys.argv[1], sys.argv[2]
e = shipyard.Estimator(entry_point="train.py", source_dir=src, instance_count=1,
                       instance_type="local", session=shipyard.Session(home=home))
e.fit(job_name="dns")
with tarfile.open(e.model_data.removeprefix("file://")) as tar:
    print("GETENT", tar.extractfile("getent").read().decode().split())
"""

TRAIN = rf"""
import subprocess
out = subprocess.run(["getent", "hosts", "{NAME}"], capture_output=True, text=True).stdout
open("/opt/ml/model/getent", "w").write(out)
"""


@pytest.mark.timeout(120)
def test_instance_resolves_through_a_resolver_on_the_host_loopback(
    loopback_resolver, write_script, tmp_path
):
    src = write_script("train.py", TRAIN)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {loopback_resolver}\nsearch shipyard.test\n")
    (tmp_path / "submit.py").write_text(SUBMIT)
    # the host's own view: the name resolves through the loopback resolver
    mount = f'mount --bind {resolv} /etc/resolv.conf && exec "$@"'
    check = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
    host_view = subprocess.run(check + ["getent", "hosts", NAME], capture_output=True, text=True)
    assert host_view.stdout.split() == [ANSWER, NAME], host_view
    done = subprocess.run(
        check + [sys.executable, str(tmp_path / "submit.py"), src, str(tmp_path / "home")],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"GETENT {[ANSWER, NAME]!r}" in done.stdout, done.stdout + done.stderr
