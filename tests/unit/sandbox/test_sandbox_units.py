"""Pure parts of the instance sandbox and what it changed around it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from shipyard.runtime.traffic import _hex_address, _owners_in_other_namespaces
from shipyard.sandbox.instance import hosts_text
from shipyard.sandbox.network import veth_name


def test_hosts_file_lists_every_host_in_order():
    text = hosts_text({"algo-10": "10.1.2.10", "algo-2": "10.1.2.2", "algo-1": "10.1.2.1"})
    assert text.splitlines()[2:] == [
        "10.1.2.1\talgo-1",
        "10.1.2.2\talgo-2",
        "10.1.2.10\talgo-10",
    ]
    assert text.startswith("127.0.0.1\tlocalhost\n")


def test_veth_names_fit_the_kernel_limit():
    assert veth_name("algo-1") == "valgo-1"
    assert len(veth_name("algo-253")) <= 15


def test_proc_net_addresses_decode():
    assert _hex_address("0100007F") == "127.0.0.1"
    assert _hex_address("0A01020A") == "10.2.1.10"
    assert _hex_address("0000000000000000FFFF00000100007F") == "127.0.0.1"  # v4-mapped
    assert _hex_address("00000000000000000000000001000000") == "::1"


def test_socket_owner_found_in_another_network_namespace():
    """The traffic report names a peer that lives in another instance's namespace."""
    import pytest

    from shipyard.sandbox import probe

    if not probe.support().ok:
        pytest.skip(probe.support().reason)
    code = (
        "import os, socket, sys; from shipyard.sandbox import kernel\n"
        "kernel.unshare(kernel.CLONE_NEWNET"
        + (" | kernel.CLONE_NEWUSER" if probe.support().rootless else "")
        + ")\nos.system('ip link set lo up')\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(child.stdout.readline())
        with socket.socket() as here:  # the same address in this namespace: not it
            here.bind(("127.0.0.1", 0))
        assert _owners_in_other_namespaces({("127.0.0.1", port)}) == {
            ("127.0.0.1", port): child.pid
        }
    finally:
        child.stdin.close()
        child.wait(timeout=10)


def test_doctor_reports_each_capability_with_a_fix_for_what_is_missing(monkeypatch):
    from typer.testing import CliRunner

    from shipyard.cli.app import app
    from shipyard.cli.doctor import checks
    from shipyard.sandbox import probe

    monkeypatch.setenv("SHIPYARD_SANDBOX", "off")
    found = {c.name: c for c in checks()}
    assert set(found) >= {"instance sandbox", "FUSE (FastFile mode)", "MPI", "TensorFlow"}
    assert {"PyTorch", "GPUs", "outbound traffic from sandboxes"} <= set(found)
    assert "bind shim (Ray nodes)" in found
    sandbox = found["instance sandbox"]
    assert not sandbox.ok and "SHIPYARD_SANDBOX=off" in sandbox.detail
    assert sandbox.fix == "unset SHIPYARD_SANDBOX"
    assert all(c.fix for c in found.values() if not c.ok)
    monkeypatch.delenv("SHIPYARD_SANDBOX")
    assert {c.name: c for c in checks()}["instance sandbox"].ok == probe.support().ok
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "instance sandbox" in result.output


def test_ray_sandbox_is_decided_on_each_node(monkeypatch):
    """The control plane asks; each Ray node answers with what its own kernel allows:
    the local backend's namespaces on the node's own network, or the reason why not."""
    from shipyard.backends.ray.actor import node_sandbox
    from shipyard.jobplan.config_sandbox import NODE_NETWORK, OFF, PER_NODE, SandboxPlan
    from shipyard.jobplan.plan import sandbox_config
    from shipyard.sandbox import probe

    monkeypatch.delenv("SHIPYARD_SANDBOX", raising=False)
    asked = sandbox_config("ray", isolation=True)
    assert asked == SandboxPlan(PER_NODE, isolation=True)
    monkeypatch.setattr(probe, "_detect", lambda network=True: probe.Support(not network, ""))
    assert node_sandbox(asked, "10.0.0.7", ("/w",)) == SandboxPlan(
        NODE_NETWORK,
        isolation=True,
        node_address="10.0.0.7",  # the bind shim's address, with or without namespaces
        hidden=("/w",),
    )
    monkeypatch.setattr(
        probe, "_detect", lambda network=True: probe.Support(False, "the kernel refused")
    )
    refused = node_sandbox(asked, "10.0.0.7")
    assert (refused.mode, refused.reason) == (OFF, "the kernel refused")
    assert refused.node_address == "10.0.0.7" and refused.decided_on_node
    monkeypatch.setenv("SHIPYARD_SANDBOX", "off")
    off = sandbox_config("ray")
    assert off == SandboxPlan(OFF, reason="SHIPYARD_SANDBOX=off")
    assert node_sandbox(off, "10.0.0.7") == off  # off: no namespaces, no shim


def test_a_ray_gpu_instance_divides_exactly_the_gpus_ray_granted_its_actor():
    from shipyard.backends.ray.actor import ray_gpus

    assert ray_gpus("ml.p3.8xlarge", [2, 3, 6, 7]) == {"SHIPYARD_GPUS": "2,3,6,7"}
    assert ray_gpus("ml.p3.2xlarge", []) == {"SHIPYARD_GPUS": "none"}
    assert ray_gpus("ml.m5.xlarge", [0]) == {}  # a CPU type: Ray granted no GPU to divide
    assert ray_gpus("local_gpu", [0]) == {}  # the whole node's, as on the local backend


def test_the_network_holder_waits_on_its_instances_without_polling(monkeypatch):
    """Issue 40: the holder looked at its instances every 0.1 s, and the backend waits for
    it at the end of every launch; it now wakes when the last of them ends. Instances
    named in two lines, one already gone, a garbled word ignored."""
    import os
    import threading

    from shipyard.sandbox import network

    def no_sleep(_seconds: float) -> None:
        raise AssertionError("the holder polled")

    monkeypatch.setattr(network.time, "sleep", no_sleep)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    first = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    second = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    read_end, write_end = os.pipe()
    returned = threading.Event()
    watcher = threading.Thread(
        target=lambda: (network.watch(60.0, stdin=read_end), returned.set()), daemon=True
    )
    try:
        watcher.start()
        os.write(write_end, f"pids {first.pid} x{gone.pid}\npids {second.pid}".encode())
        os.write(write_end, f" {gone.pid}\n".encode())
        first.communicate(b"")
        assert not returned.wait(0.3)  # the second is still running
        assert second.stdin is not None
        second.stdin.close()  # it ends, not reaped here: a zombie counts as ended
        assert returned.wait(30.0)  # a hang guard only
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
        os.close(write_end)
        os.close(read_end)


def test_the_network_holder_gives_up_when_no_instance_is_named():
    import os

    from shipyard.sandbox import network

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"pids\n")
        network.watch(0.2, stdin=read_end)  # returns: the attach timeout
    finally:
        os.close(write_end)
        os.close(read_end)


def _run_holder(argv: list[str]) -> tuple[str, bool, str]:
    """Start a network holder from ``argv`` (its python under ``-X importtime``): its
    first line, whether its namespace had the bridge then, and what it imported; it
    is ended by closing its stdin (no instance named: nothing to hold)."""
    at = next(i for i, word in enumerate(argv) if word == sys.executable) + 1
    argv = [*argv[:at], "-X", "importtime", *argv[at:]]
    holder = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": os.defpath},
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        line = holder.stdout.readline().decode().strip()
        try:
            with open(f"/proc/{holder.pid}/net/dev", encoding="ascii") as fh:
                bridged = any(row.split(":")[0].strip() == "br0" for row in fh.readlines()[2:])
        except (FileNotFoundError, ProcessLookupError):
            # a holder that failed exits after its line (CI saw it gone already): its
            # namespace went with it, so it holds no bridge
            bridged = False
        holder.stdin.close()
        holder.wait(timeout=30)  # a hang guard only
        assert holder.stderr is not None
        errors = holder.stderr.read()
    finally:
        holder.kill()
        holder.wait()
    return line, bridged, errors.decode()


def _imported(importtime: str) -> set[str]:
    return {
        row.split("|")[-1].strip()
        for row in importtime.splitlines()
        if row.startswith("import time:") and "|" in row
    } - {"package"}


HEAVY = {"argparse", "subprocess", "typing", "gettext", "shutil", "site", "enum", "shipyard"}


@pytest.mark.parametrize("with_unshare", [True, False])
def test_the_network_holder_starts_with_the_stdlib_only(monkeypatch, with_unshare):
    """Issue 40: the holder ran as ``python -m shipyard.sandbox.network``: site and the
    environment's .pth files, argparse, subprocess, shipyard's package (typing): 70-95 ms
    of CPU per job. Now util-linux ``unshare`` makes its namespaces (or, without it, the
    holder through ctypes) and it imports os/select/sys/time beyond Python's own start."""
    from shipyard.sandbox import network, probe, tools

    if not probe.support().ok:
        pytest.skip(probe.support().reason)
    rootless = probe.support().rootless
    if not with_unshare:
        found = tools.find
        monkeypatch.setattr(tools, "find", lambda name: None if name == "unshare" else found(name))
    argv = network.holder_argv(os.getpid(), rootless)
    assert any(os.path.basename(word) == "unshare" for word in argv) == with_unshare
    line, bridged, errors = _run_holder(argv)
    assert (line, bridged) == ("ready", True), errors
    heavy = HEAVY | ({"ctypes"} if with_unshare else set())
    assert _imported(errors) & heavy == set()


def test_the_network_holder_says_why_it_has_no_bridge():
    from shipyard.sandbox import network, probe

    if not probe.support().ok:
        pytest.skip(probe.support().reason)
    argv = network.holder_argv(os.getpid(), probe.support().rootless)
    argv[argv.index("--ip") + 1] = "/bin/false"
    line, bridged, _ = _run_holder(argv)
    assert line.startswith("error: ip failed") and not bridged


def test_a_sandboxed_agents_start_imports_no_pydantic():
    """Issue 40: the instance's sandbox (its disk's detach among its steps) imported
    shipyard.spec, and with it pydantic: 0.1-0.4 s of CPU in every sandboxed agent."""
    code = (
        "import sys, shipyard.agent.__main__\n"
        "from shipyard.sandbox import confine, disk, fsview, instance, pidns, seccomp\n"
        "print(' '.join(m for m in ('pydantic', 'shipyard.spec') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_the_init_begins_before_the_veth_is_attached(monkeypatch, tmp_path):
    """Issue 40: the agent waited 60-70 ms for its instance's init (loaded 2-core machine),
    which began only after the veth's two ``ip`` runs; the init now begins first and the
    network is attached while it builds the view."""
    from types import SimpleNamespace

    from shipyard.agent import __main__ as agent

    order: list[str] = []
    monkeypatch.setattr(agent, "build_tree", lambda config, host, paths: paths)
    monkeypatch.setattr(agent, "early_init", lambda config, host: order.append("init"))
    monkeypatch.setattr(agent, "connect_sandbox", lambda c, h, box: order.append("network"))

    class _Stop(Exception):
        pass

    def stop(*_a):
        order.append("code")
        raise _Stop

    monkeypatch.setattr(agent, "stage_code", stop)

    class Box:
        holder_pid = 1

    class Config:
        submit_directory = str(tmp_path)

    try:
        paths = SimpleNamespace(code=str(tmp_path / "code"))
        agent.run_instance(Config(), "algo-1", None, paths, Box())  # type: ignore[arg-type]
    except _Stop:
        pass
    assert order == ["init", "network", "code"]


def test_pasta_is_pointed_at_the_instances_namespace_by_fd():
    """pasta's shell opens its target whenever it runs; /proc/<agent>/ns/net named the
    namespace of the agent's thread at that moment, which is the job's while the veth is
    attached (``connect``), so the target is the agent's fd of the instance's own."""
    import io

    from shipyard.sandbox.instance import InstanceSandbox, _release_pasta

    box = InstanceSandbox(holder_pid=1, host="algo-1", hosts={}, tree="/t", own_net=7)

    class Waiter:
        stdin = io.BytesIO()

    waiter = Waiter()
    waiter.stdin.close = lambda: None  # type: ignore[method-assign]
    _release_pasta(box, waiter)  # type: ignore[arg-type]
    assert waiter.stdin.getvalue() == f"/proc/{os.getpid()}/fd/7\n".encode()
    box.data_net = 9  # network isolation: the agent's data network
    waiter.stdin = io.BytesIO()
    waiter.stdin.close = lambda: None  # type: ignore[method-assign]
    _release_pasta(box, waiter)  # type: ignore[arg-type]
    assert waiter.stdin.getvalue() == f"/proc/{os.getpid()}/fd/9\n".encode()
