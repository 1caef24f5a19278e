"""The instance's veth and address over netlink (shipyard.sandbox.rtnl, issue 40): the
requests two ``ip -batch`` processes per instance made, without the processes."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from shipyard.sandbox import rtnl


def _attrs(data: bytes) -> dict[int, bytes]:
    out, offset = {}, 0
    while offset + 4 <= len(data):
        size, kind = struct.unpack_from("=HH", data, offset)
        out[kind] = data[offset + 4 : offset + size]
        offset += (size + 3) & ~3
    return out


def test_the_veth_request_names_both_ends_and_the_peers_namespace():
    body = rtnl.veth_request("valgo-1", "eth0", 7)
    top = _attrs(body[16:])  # after the ifinfomsg
    assert top[rtnl.IFLA_IFNAME] == b"valgo-1\0"
    info = _attrs(top[rtnl.IFLA_LINKINFO])
    assert info[rtnl.IFLA_INFO_KIND] == b"veth\0"
    peer = _attrs(info[rtnl.IFLA_INFO_DATA])[rtnl.VETH_INFO_PEER]
    peer_attrs = _attrs(peer[16:])
    assert peer_attrs[rtnl.IFLA_IFNAME] == b"eth0\0"
    assert struct.unpack("=I", peer_attrs[rtnl.IFLA_NET_NS_FD]) == (7,)


def test_the_address_request_sets_local_and_address_with_the_prefix():
    body = rtnl.address_request("10.1.2.3", 24, 5)
    family, prefix, _flags, scope, index = struct.unpack_from("=BBBBI", body)
    assert (prefix, scope, index) == (24, 0, 5) and family == 2  # AF_INET
    attrs = _attrs(body[8:])
    assert attrs[rtnl.IFA_LOCAL] == attrs[rtnl.IFA_ADDRESS] == bytes([10, 1, 2, 3])


@pytest.mark.parametrize("name", ["", "a" * 16, "a/b", "a\0b"])
def test_a_bad_interface_name_is_refused(name):
    with pytest.raises(ValueError, match="not an interface name"):
        rtnl.name_attr(name)


@pytest.mark.parametrize(
    ("address", "prefix"), [("10.1", 24), ("10.1.2.300", 24), ("10.1.2.3", 33)]
)
def test_a_bad_address_is_refused(address, prefix):
    with pytest.raises((ValueError, OSError)):
        rtnl.address_request(address, prefix, 1)


# Run in a child of its own network namespace (two: the "job's" with a bridge, and the
# "instance's"), as the agent's connect does; subprocess.Popen fails there, so the
# attach cannot have started a process (it ran two `ip` before issue 40).
ATTACH = """
import json, os, subprocess, sys
from shipyard.sandbox import instance, kernel, rtnl
if sys.argv[1] == "rootless":
    uid, gid = os.getuid(), os.getgid()
    kernel.unshare(kernel.CLONE_NEWUSER | kernel.CLONE_NEWNET)
    kernel.map_root_to(uid, gid)
else:
    kernel.unshare(kernel.CLONE_NEWNET)
job = os.open("/proc/self/ns/net", os.O_RDONLY)
subprocess.run(["ip", "link", "add", "br0", "type", "bridge"], check=True)
kernel.unshare(kernel.CLONE_NEWNET)
own = os.open("/proc/self/ns/net", os.O_RDONLY)
box = instance.InstanceSandbox(holder_pid=1, host="algo-1", hosts={"algo-1": "10.9.0.1"},
                               tree="/nonexistent")
def no_process(*a, **k):
    raise AssertionError("a process was started")
real_popen, subprocess.Popen = subprocess.Popen, no_process
instance._attach(box, job, own)
try:  # a second veth of the same name: the kernel's refusal, named
    kernel.setns(job, kernel.CLONE_NEWNET)
    with rtnl.Route() as route:
        route.add_veth("valgo-1", "eth1", own)
    refused = ""
except OSError as exc:
    refused = str(exc)
try:
    with rtnl.Route() as route:
        route.index("nosuch0")
    missing = ""
except OSError as exc:
    missing = str(exc)
subprocess.Popen = real_popen
show = lambda *a: subprocess.run(["ip", "-j", *a], capture_output=True, text=True, check=True).stdout
job_links = json.loads(show("link"))
kernel.setns(own, kernel.CLONE_NEWNET)
print(json.dumps({"job": job_links, "own": json.loads(show("addr")), "refused": refused,
                  "missing": missing}))
"""


def test_attach_puts_the_veth_on_the_bridge_and_addresses_eth0_without_a_process():
    from shipyard.sandbox import probe

    support = probe.support()
    if not support.ok:
        pytest.skip(support.reason)
    done = subprocess.run(
        [sys.executable, "-c", ATTACH, "rootless" if support.rootless else "root"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    veth = next(link for link in seen["job"] if link["ifname"] == "valgo-1")
    assert veth["master"] == "br0" and "UP" in veth["flags"]
    own = {link["ifname"]: link for link in seen["own"]}
    assert "UP" in own["lo"]["flags"] and "UP" in own["eth0"]["flags"]
    ipv4 = [a for a in own["eth0"]["addr_info"] if a["family"] == "inet"]
    assert [(a["local"], a["prefixlen"]) for a in ipv4] == [("10.9.0.1", 24)]
    assert seen["refused"] == "[Errno 17] link add valgo-1 type veth peer name eth1: File exists"
    assert seen["missing"] == "[Errno 19] nosuch0: No such device"
