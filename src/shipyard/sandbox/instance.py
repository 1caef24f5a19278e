"""Entering an instance's sandbox: called first thing by the instance's agent.

The agent (single-threaded at this point, as setns on a user namespace requires) joins
the job's user namespace when rootless, unshares mount, UTS and network namespaces,
attaches its new network namespace to the job's bridge with a veth pair, names itself
``algo-k`` and mounts its tree at ``/opt/ml`` and the job's hosts file at ``/etc/hosts``.
Everything it creates belongs to its namespaces: when the instance's last process ends,
the kernel removes them (the veth pair included), whatever ended it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

from shipyard.sandbox import kernel, network, tools

OPT_ML = "/opt/ml"
ETC_HOSTS = "/etc/hosts"
PREFIX_LEN = 24


@dataclass
class InstanceSandbox:
    holder_pid: int
    host: str
    hosts: dict[str, str]  # algo-k -> its address on the job network
    tree: str  # the instance's tree on the host (<job>/instances/algo-k)
    rootless: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.hosts[self.host]


def hosts_text(hosts: dict[str, str]) -> str:
    """The instance's /etc/hosts: loopback names plus every ``algo-k`` of the job."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{addr}\t{host}" for host, addr in sorted(hosts.items(), key=_host_order)]
    return "\n".join(lines) + "\n"


def _host_order(item: tuple[str, str]) -> tuple[int, str]:
    host = item[0]
    suffix = host.rsplit("-", 1)[-1]
    return (int(suffix) if suffix.isdigit() else 0, host)


def _ip(batch: str, pass_fds: tuple[int, ...] = ()) -> None:
    ip = tools.find("ip")
    if ip is None:
        raise OSError("iproute2's `ip` is not installed")
    done = subprocess.run(
        [ip, "-batch", "-"], input=batch.encode(), capture_output=True, pass_fds=pass_fds
    )
    if done.returncode != 0:
        raise OSError(f"ip failed ({batch.strip()!r}): {done.stderr.decode(errors='replace')}")


def enter(box: InstanceSandbox) -> None:
    """Move this process into its instance sandbox (see the module docstring)."""
    holder = f"/proc/{box.holder_pid}/ns"
    if box.rootless:
        user_fd = os.open(f"{holder}/user", os.O_RDONLY)
        try:
            kernel.setns(user_fd, kernel.CLONE_NEWUSER)
        finally:
            os.close(user_fd)
    job_net = os.open(f"{holder}/net", os.O_RDONLY)
    try:
        kernel.unshare(kernel.CLONE_NEWNS | kernel.CLONE_NEWUTS | kernel.CLONE_NEWNET)
        own_net = os.open("/proc/self/ns/net", os.O_RDONLY)
        try:
            _attach(box, job_net, own_net)
        finally:
            os.close(own_net)
    finally:
        os.close(job_net)
    kernel.sethostname(box.host)
    # nothing mounted here may propagate back to the host's mount namespace
    kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
    hosts_file = os.path.join(box.tree, "agent", "hosts")
    os.makedirs(os.path.dirname(hosts_file), exist_ok=True)
    with open(hosts_file, "w", encoding="ascii") as fh:
        fh.write(hosts_text(box.hosts))
    kernel.mount(hosts_file, os.path.realpath(ETC_HOSTS), None, kernel.MS_BIND)
    mount_tree(box.tree)


def _attach(box: InstanceSandbox, job_net: int, own_net: int) -> None:
    """A veth pair: ``v<host>`` on the job's bridge, ``eth0`` with the instance's address."""
    veth = network.veth_name(box.host)
    kernel.setns(job_net, kernel.CLONE_NEWNET)
    try:
        _ip(
            f"link add {veth} type veth peer name eth0 netns /proc/self/fd/{own_net}\n"
            f"link set {veth} master {network.BRIDGE}\n"
            f"link set {veth} up\n",
            pass_fds=(own_net,),
        )
    finally:
        kernel.setns(own_net, kernel.CLONE_NEWNET)
    _ip(f"link set lo up\naddr add {box.address}/{PREFIX_LEN} dev eth0\nlink set eth0 up\n")


def mount_tree(tree: str) -> None:
    """Bind the instance's tree at /opt/ml. Where the host has no /opt/ml, /opt becomes a
    read-only tmpfs holding the host's /opt entries (bound back) plus ``ml``: the host is
    left untouched and nothing new can be written to /opt."""
    if os.path.isdir(OPT_ML):
        kernel.mount(tree, OPT_ML, None, kernel.MS_BIND | kernel.MS_REC)
        return
    parent = os.path.dirname(OPT_ML)
    if not os.path.isdir(parent):
        raise OSError(f"{parent} does not exist on this machine; cannot map {OPT_ML}")
    original = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entries = os.listdir(original)
        kernel.mount("tmpfs", parent, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, "mode=755")
        for name in entries:
            source = f"/proc/self/fd/{original}/{name}"
            target = os.path.join(parent, name)
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
            elif os.path.isdir(source):
                os.mkdir(target)
                kernel.mount(source, target, None, kernel.MS_BIND | kernel.MS_REC)
            else:
                open(target, "w").close()
                kernel.mount(source, target, None, kernel.MS_BIND | kernel.MS_REC)
        os.mkdir(OPT_ML)
        kernel.mount(tree, OPT_ML, None, kernel.MS_BIND | kernel.MS_REC)
        kernel.mount(
            None,
            parent,
            None,
            kernel.MS_REMOUNT | kernel.MS_RDONLY | kernel.MS_NOSUID | kernel.MS_NODEV,
        )
    finally:
        os.close(original)
