"""Entering an instance's sandbox: called first thing by the instance's agent.

The agent (single-threaded at this point, as setns on a user namespace requires) joins
the job's user namespace when rootless, unshares mount, UTS, network and IPC namespaces,
attaches its new network namespace to the job's bridge with a veth pair, names itself
``algo-k`` and mounts its tree at ``/opt/ml`` and the job's hosts file at ``/etc/hosts``.
Everything it creates belongs to its namespaces: when the instance's last process ends,
the kernel removes them (the veth pair included), whatever ended it.

Outbound traffic: pasta (from passt, what rootless Podman uses) runs in the host's network
namespace as a child of the agent and gives the instance a ``tap0`` with the host's
addressing and default route (``--config-net``); it forwards nothing inbound (``-t none
-u none``: its default would expose the instance's listeners on the host), does not map
the gateway to the host's loopback (``--no-map-gw``), and forwards only the job's S3
endpoint port from the instance's loopback to the host's (``-T``), so an endpoint on the
host's 127.0.0.1 keeps working. With network isolation pasta serves the agent's data
network instead (shipyard.sandbox.datanet): the instance's own namespace keeps only the
job network, and the job's processes reach neither the host nor the S3 endpoint.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shipyard.sandbox import datanet, kernel, network, rtnl, tools

if TYPE_CHECKING:
    from shipyard.sandbox import shaping

OPT_ML = "/opt/ml"
ETC_HOSTS = "/etc/hosts"
ETC_RESOLV = "/etc/resolv.conf"
# the instance's nameserver: pasta answers UDP port 53 sent there by forwarding it to the
# host's first resolver from the host's own namespace, so a resolver on the host's
# loopback (systemd-resolved's 127.0.0.53, Docker's 127.0.0.11) serves instances too; the
# link-local address rootless Podman uses for the same, never a real host
DNS_FORWARD = "169.254.1.1"
PREFIX_LEN = 24


@dataclass
class InstanceSandbox:
    holder_pid: int | None  # None: no job network (Ray: the node's own network)
    host: str
    hosts: dict[str, str]  # algo-k -> its address on the job network
    tree: str  # the instance's tree on the host (<job>/instances/algo-k)
    rootless: bool = False
    outbound: bool = True  # False: network isolation (no route out of the job network)
    forward_ports: list[int] = field(default_factory=list)  # host loopback ports to reach
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # protections it runs without, and why
    pasta: subprocess.Popen | None = None  # released, maybe not ready yet (wait_outbound)
    pasta_pid: int | None = None  # kept running until the agent's last upload is done
    shape: shaping.Shape | None = None  # the shipyard:network tag's link (shaping.py)
    # network isolation: the agent's data network (shipyard.sandbox.datanet)
    data_net: int | None = None
    # the instance's own network namespace (an fd, kept: pasta's target, the way back
    # from the data network)
    own_net: int | None = None

    @property
    def address(self) -> str:
        return self.hosts[self.host]

    @property
    def isolated_data_path(self) -> bool:
        """Network isolation: the agent's transfers go through a data network of its own."""
        return not self.outbound


def hosts_text(hosts: dict[str, str]) -> str:
    """The instance's /etc/hosts: loopback names plus every ``algo-k`` of the job."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{addr}\t{host}" for host, addr in sorted(hosts.items(), key=_host_order)]
    return "\n".join(lines) + "\n"


def _host_order(item: tuple[str, str]) -> tuple[int, str]:
    host = item[0]
    suffix = host.rsplit("-", 1)[-1]
    return (int(suffix) if suffix.isdigit() else 0, host)


PASTA_READY_TIMEOUT_S = 10.0


def _pasta_waiter(box: InstanceSandbox) -> subprocess.Popen | None:
    """pasta, started now (in the host's namespaces) but held by a shell until the
    instance's namespaces exist: it is released by writing a line to its stdin."""
    pasta = tools.find("pasta")
    if pasta is None:
        what = "the agent's channel transfers have" if box.isolated_data_path else "it has"
        box.notes.append(
            f"pasta (passt) is not installed: {what} no outbound network (apt-get install passt)"
        )
        return None
    argv = [pasta, "-q", "-f", "-I", "tap0", "--no-map-gw", "-t", "none", "-u", "none"]
    argv += ["-U", "none", "-T", ",".join(map(str, box.forward_ports)) or "none"]
    if os.geteuid() == 0:  # else it drops to nobody, which cannot enter the namespaces
        argv += ["--runas", "0:0"]
    # isolated: the data network gets the outbound network (the agent's transfers)
    argv += ["--config-net", "--dns-forward", DNS_FORWARD]
    # the shell opens the agent's namespaces once they exist (fds 3, 4): pasta, which
    # drops to an unprivileged user first, could not open another process's
    if box.rootless:
        argv += ["--userns", "/proc/self/fd/4"]
    argv += ["--netns", "/proc/self/fd/3"]
    from shipyard.runtime.lifeline import death_signal_argv

    me = os.getpid()
    # the released line names the network namespace to serve (_release_pasta)
    script = f'read ns && exec 3<"$ns" 4</proc/{me}/ns/user && exec "$@"'
    return subprocess.Popen(
        ["/bin/sh", "-c", script, "pasta-waiter", *death_signal_argv(argv)],
        stdin=subprocess.PIPE,
        close_fds=True,
    )


def _release_pasta(box: InstanceSandbox, waiter: subprocess.Popen | None) -> None:
    """pasta goes to the instance's network namespace, or with network isolation to the
    agent's data network (opened through the agent's fd)."""
    if waiter is not None and waiter.stdin is not None:
        # an fd, not /proc/<agent>/ns/net: the shell opens it whenever it runs, maybe
        # while the agent is in the job's namespace attaching its veth (``connect``)
        me = os.getpid()
        target = f"/proc/{me}/fd/{box.data_net if box.data_net is not None else box.own_net}"
        waiter.stdin.write(target.encode() + b"\n")
        waiter.stdin.close()


def wait_outbound(box: InstanceSandbox) -> None:
    """Until pasta has set up the instance's outbound network (called by the agent just
    before anything may need it, so pasta's start overlaps the agent's own set-up)."""
    waiter = box.pasta
    box.pasta = None
    if waiter is None:
        return
    deadline = time.monotonic() + PASTA_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if _pasta_ready(box):
            return
        if waiter.poll() is not None:
            break
        time.sleep(0.005)
    code = waiter.poll()
    why = f"exited with status {code}" if code is not None else "timed out"
    box.notes.append(f"pasta did not set up this instance's outbound network ({why})")


def _pasta_ready(box: InstanceSandbox) -> bool:
    if box.data_net is not None and box.own_net is not None:
        return datanet.run_in(box.data_net, box.own_net, lambda: _serves(box, outbound=True))
    return _serves(box, box.outbound)


def _serves(box: InstanceSandbox, outbound: bool) -> bool:
    """pasta has configured this thread's network namespace."""
    if outbound and not _has_default_route():
        return False
    return all(_listens_locally(p) for p in box.forward_ports)


def _has_default_route() -> bool:
    with open("/proc/thread-self/net/route", encoding="ascii") as fh:
        return any(line.split()[1] == "00000000" for line in fh.readlines()[1:] if line.strip())


def _listens_locally(port: int) -> bool:
    """Something listens on 127.0.0.1:``port`` in this network namespace."""
    want = f"0100007F:{port:04X}"
    with open("/proc/thread-self/net/tcp", encoding="ascii") as fh:
        return any(
            fields[1] == want and fields[3] == "0A"
            for fields in (line.split() for line in fh.readlines()[1:])
        )


def enter(box: InstanceSandbox) -> None:
    """Move this process into its instance sandbox (see the module docstring): its
    namespaces and mounts; ``connect`` then attaches it to the job's network. pasta is
    released as soon as the instance's network namespace exists (with network isolation,
    once the data network does, in ``connect``), and the agent begins the instance's init
    between the two: neither start waits for the veth's two ``ip`` runs (issue 40: the
    agent waited 60-70 ms for its init on a loaded 2-core machine)."""
    if box.holder_pid is None:
        raise ValueError("enter() needs the job network's holder; see enter_without_network")
    waiter = _pasta_waiter(box)
    _wait_for_holder(box)
    if box.rootless:
        user_fd = os.open(f"/proc/{box.holder_pid}/ns/user", os.O_RDONLY)
        try:
            kernel.setns(user_fd, kernel.CLONE_NEWUSER)
        finally:
            os.close(user_fd)
    unshare_with_ipc(box, kernel.CLONE_NEWNS | kernel.CLONE_NEWUTS | kernel.CLONE_NEWNET)
    box.own_net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    box.pasta = waiter
    box.pasta_pid = waiter.pid if waiter is not None else None
    if not box.isolated_data_path:
        _release_pasta(box, waiter)
    _name_and_mount(box)


def connect(box: InstanceSandbox) -> None:
    """The instance's network namespace on the job's bridge (a thread-safe step: only
    network namespaces are entered, so the agent's init may be starting meanwhile); with
    network isolation, the agent's data network, into which pasta is released."""
    assert box.holder_pid is not None and box.own_net is not None
    job_net = os.open(f"/proc/{box.holder_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _attach(box, job_net, box.own_net)
        if box.isolated_data_path:
            box.data_net = datanet.create(box.own_net)
    finally:
        os.close(job_net)
    if box.isolated_data_path:
        _release_pasta(box, box.pasta)


def enter_without_network(box: InstanceSandbox) -> None:
    """The Ray backend's sandbox: mount and UTS namespaces without a network one
    (``/opt/ml``, hostname ``algo-k``, an ``/etc/hosts`` naming every instance's node
    address; the PID namespace, privileges and filesystem view follow as on the local
    backend, in the agent); the instance keeps its node's network, since its peers are
    on other machines. Rootless, it
    unshares a user namespace of its own in which the user is root (the local backend's
    instances join the holder's instead)."""
    if box.rootless:
        uid, gid = os.getuid(), os.getgid()
        kernel.unshare(kernel.CLONE_NEWUSER)
        kernel.map_root_to(uid, gid)
    unshare_with_ipc(box, kernel.CLONE_NEWNS | kernel.CLONE_NEWUTS)
    _name_and_mount(box)


IPC_MISSING = (
    "no IPC namespace ({why}): the job's processes share this machine's System V "
    "shared memory, semaphores and message queues"
)


def unshare_with_ipc(box: InstanceSandbox, flags: int) -> None:
    """Unshare ``flags`` and an IPC namespace of the instance's own: its System V shared
    memory, semaphores, message queues and POSIX message queues are the instance's (the
    ranks of one instance share them, as Open MPI's shared memory needs), gone with it,
    and the host's are out of reach. A kernel without IPC namespaces gets the rest,
    with the missing protection named."""
    try:
        kernel.unshare(flags | kernel.CLONE_NEWIPC)
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSPC, errno.EPERM):
            raise
        why = os.strerror(exc.errno)
    kernel.unshare(flags)
    note = IPC_MISSING.format(why=why)
    box.missing.append(note)  # describe's protections
    box.notes.append(f"protection missing: {note}")  # the instance's log


def _name_and_mount(box: InstanceSandbox) -> None:
    """Hostname, /etc/hosts, /etc/resolv.conf (with pasta's DNS forwarder) and /opt/ml,
    in the mount and UTS namespaces this process has just unshared."""
    kernel.sethostname(box.host)
    # nothing mounted here may propagate back to the host's mount namespace
    kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
    # other jobs' disks of VolumeSizeInGB, copied with the host's mounts: let them go
    from shipyard.sandbox import disk

    disk.detach_others(os.path.dirname(box.tree))
    hosts_file = os.path.join(box.tree, "agent", "hosts")
    os.makedirs(os.path.dirname(hosts_file), exist_ok=True)
    with open(hosts_file, "w", encoding="ascii") as fh:
        fh.write(hosts_text(box.hosts))
    kernel.mount(hosts_file, os.path.realpath(ETC_HOSTS), None, kernel.MS_BIND)
    if box.pasta is not None and os.path.isfile(ETC_RESOLV):
        resolv_file = os.path.join(box.tree, "agent", "resolv.conf")
        with open(resolv_file, "w", encoding="utf-8") as fh:
            fh.write(resolv_text(_read(ETC_RESOLV)))
        kernel.mount(resolv_file, os.path.realpath(ETC_RESOLV), None, kernel.MS_BIND)
    mount_tree(box.tree)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def resolv_text(host_resolv: str) -> str:
    """The instance's /etc/resolv.conf: pasta's DNS forwarder as the only nameserver (the
    host's own may be on its loopback, out of the instance's reach), the host's search
    domains and options kept."""
    kept = [
        line
        for line in host_resolv.splitlines()
        if line.split()[:1] and line.split()[0] in ("search", "domain", "options")
    ]
    return "\n".join([f"nameserver {DNS_FORWARD}", *kept]) + "\n"


HOLDER_WAIT_S = 15.0


def _wait(ready, what: str) -> None:
    """The backend starts agents without waiting for the holder (their start-up overlaps
    its own); each agent waits here for the part it needs."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    delay = 0.001
    while not ready():
        if time.monotonic() > deadline:
            raise OSError(f"{what} did not appear within {HOLDER_WAIT_S:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _wait_for_holder(box: InstanceSandbox) -> None:
    """Until the holder is in its own namespaces (and, rootless, has its id maps)."""
    holder = f"/proc/{box.holder_pid}"

    def entered() -> bool:
        try:
            if os.readlink(f"{holder}/ns/net") == os.readlink("/proc/self/ns/net"):
                return False
            if box.rootless:
                with open(f"{holder}/gid_map", encoding="ascii") as fh:
                    return bool(fh.read().strip())
            return True
        except OSError:
            return False

    _wait(entered, "the job network's namespace")


def _links() -> list[str]:
    """Interfaces of this process's current network namespace."""
    with open("/proc/self/net/dev", encoding="ascii") as fh:
        return [line.split(":", 1)[0].strip() for line in fh.readlines()[2:]]


def _attach(box: InstanceSandbox, job_net: int, own_net: int) -> None:
    """A veth pair: ``v<host>`` on the job's bridge, ``eth0`` with the instance's address
    (over netlink, shipyard.sandbox.rtnl: the requests two ``ip -batch`` runs made)."""
    veth = network.veth_name(box.host)
    kernel.setns(job_net, kernel.CLONE_NEWNET)
    try:
        _wait(lambda: network.BRIDGE in _links(), "the job's bridge")
        with rtnl.Route() as job:  # what `ip link add/set` asked, without an `ip` process
            job.add_veth(veth, "eth0", own_net)
            job.set_master(veth, network.BRIDGE)
            job.set_up(veth)
        if box.shape is not None:  # what the instance receives
            from shipyard.sandbox import shaping

            box.notes.extend(shaping.apply(veth, box.shape))
    finally:
        kernel.setns(own_net, kernel.CLONE_NEWNET)
    with rtnl.Route() as own:
        own.set_up("lo")
        own.add_address("eth0", box.address, PREFIX_LEN)
        own.set_up("eth0")
    if box.shape is not None:  # what it sends; a failure is said once, by the first
        from shipyard.sandbox import shaping

        notes = shaping.apply("eth0", box.shape)
        box.notes.extend(n for n in notes if n not in box.notes)


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
