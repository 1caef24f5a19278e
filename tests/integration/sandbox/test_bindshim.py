"""The bind() shim (shipyard.sandbox.bindshim): real processes, real sockets, `ss`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from shipyard.sandbox import bindshim

ADDRESS = "127.0.0.77"  # any address of this machine other than 127.0.0.1

BINDER = textwrap.dedent(
    r"""
    import json, socket, sys
    out = {}
    def listen(family, addr, v6only=None, kind=socket.SOCK_STREAM):
        s = socket.socket(family, kind)
        if v6only is not None:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        s.bind(addr)
        if kind == socket.SOCK_STREAM:
            s.listen()
        keep.append(s)
        return s.getsockname()[:2]
    keep = []
    out["any4"] = listen(socket.AF_INET, ("0.0.0.0", 0))
    out["dual6"] = listen(socket.AF_INET6, ("::", 0), v6only=0)
    out["only6"] = listen(socket.AF_INET6, ("::", 0), v6only=1)
    out["loop4"] = listen(socket.AF_INET, ("127.0.0.1", 0))
    out["udp4"] = listen(socket.AF_INET, ("0.0.0.0", 0), kind=socket.SOCK_DGRAM)
    print(json.dumps(out), flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture(scope="module")
def shim() -> str:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    built = bindshim.build()
    assert built.path is not None, built.reason
    return built.path


def _listeners(pid: int) -> list[str]:
    """Local addresses of the TCP listeners of ``pid`` as `ss` prints them."""
    out = subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return [line.split()[3] for line in out if f"pid={pid}," in line]


def test_wildcard_tcp_binds_become_the_cluster_address(shim):
    env, note = bindshim.environment(dict(os.environ), ADDRESS)
    assert env["LD_PRELOAD"].startswith(shim) and ADDRESS in note
    proc = subprocess.Popen(
        [sys.executable, "-c", BINDER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        got = json.loads(proc.stdout.readline())
        assert got["any4"][0] == ADDRESS
        assert got["dual6"][0] == f"::ffff:{ADDRESS}"
        assert got["only6"][0] == "::1"  # an IPv4 cluster has no IPv6 address: loopback
        assert got["loop4"][0] == "127.0.0.1"  # explicit addresses are left alone
        assert got["udp4"][0] == "0.0.0.0"  # only TCP listeners are moved
        seen = _listeners(proc.pid)
        assert sorted(seen) == sorted(
            [
                f"{ADDRESS}:{got['any4'][1]}",
                f"[::ffff:{ADDRESS}]:{got['dual6'][1]}",
                f"[::1]:{got['only6'][1]}",
                f"127.0.0.1:{got['loop4'][1]}",
            ]
        ), seen
        assert not [s for s in seen if s.startswith(("0.0.0.0:", "*:", "[::]:"))]
        # the moved listeners answer on the cluster address only
        socket.create_connection((ADDRESS, got["any4"][1]), timeout=5).close()
        socket.create_connection((ADDRESS, got["dual6"][1]), timeout=5).close()
        for port in (got["any4"][1], got["dual6"][1]):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        proc.kill()
        proc.wait()


def test_without_the_address_nothing_moves(shim):
    env = dict(os.environ, LD_PRELOAD=shim)
    env.pop(bindshim.ADDRESS_ENV, None)
    out = subprocess.run(
        [sys.executable, "-c", BINDER], env=env, input="", capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["any4"][0] == "0.0.0.0"


def test_concurrent_builders_share_one_cached_library(tmp_path, monkeypatch, shim):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bindshim.build.cache_clear()
    try:
        with ThreadPoolExecutor(4) as pool:  # four builders race on an empty cache
            built = list(pool.map(lambda _: bindshim.build.__wrapped__(), range(4)))
        paths = {b.path for b in built}
        assert len(paths) == 1 and None not in paths, built
        directory = tmp_path / "cache" / "shipyard"
        assert [p.name for p in directory.iterdir()] == [os.path.basename(paths.pop())]
        assert oct(directory.stat().st_mode & 0o777) == "0o700"
    finally:
        bindshim.build.cache_clear()


def test_no_compiler_means_no_shim_and_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    monkeypatch.delenv("CC", raising=False)
    bindshim.build.cache_clear()
    try:
        env, note = bindshim.environment({"A": "1"}, ADDRESS)
        assert env == {"A": "1"}
        assert "no C compiler" in note and "every address of this node" in note
    finally:
        bindshim.build.cache_clear()


def test_a_cache_directory_others_can_write_is_not_used(tmp_path, monkeypatch, shim):
    cache = tmp_path / "cache"
    (cache / "shipyard").mkdir(parents=True)
    os.chmod(cache / "shipyard", 0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    bindshim.build.cache_clear()
    try:
        import tempfile

        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
        built = bindshim.build()
        assert built.path is not None and built.path.startswith(str(tmp_path / "tmp"))
    finally:
        bindshim.build.cache_clear()


def test_without_takes_only_the_shim_out():
    """The mpi runner's way back to plain binds (loopback node addresses)."""
    env = {"LD_PRELOAD": "/c/bindshim-0123.so /lib/other.so", bindshim.ADDRESS_ENV: "10.0.0.1"}
    assert bindshim.without(env) == {"LD_PRELOAD": "/lib/other.so"}
    assert bindshim.without({"LD_PRELOAD": "/c/bindshim-0123.so", "A": "1"}) == {"A": "1"}
