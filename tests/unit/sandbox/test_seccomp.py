"""The seccomp filter's rules (shipyard.sandbox.seccomp), the launcher that loads it
(shipyard.sandbox.launch) and the environment it is handed (shipyard.sandbox.confine).

The rules are checked as data, and the built filter on a real process: a child loads it
with the launcher's own code and tries what a job would."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from shipyard.sandbox import confine, launch, launchbin, masks, seccomp

# what issue 37 names: the calls a container runtime's default profile refuses
MUST_DENY = """
setns mount umount2 pivot_root move_mount open_tree fsopen fsmount fsconfig fspick
mount_setattr keyctl add_key request_key init_module finit_module delete_module kexec_load
kexec_file_load bpf perf_event_open clock_settime settimeofday adjtimex clock_adjtime stime
swapon swapoff reboot acct quotactl userfaultfd lookup_dcookie open_by_handle_at iopl ioperm
create_module get_kernel_syms query_module nfsservctl vm86 uselib ustat sysfs _sysctl
""".split()


def test_the_rule_list_refuses_what_container_runtimes_refuse():
    denied = seccomp.denied_syscalls()
    assert set(MUST_DENY) <= set(denied), sorted(set(MUST_DENY) - set(denied))
    # allowed, as in Docker's profile on current kernels: debuggers, py-spy in the job
    assert "ptrace" not in denied and "name_to_handle_at" not in denied
    by_name = {rule.syscall: rule for rule in seccomp.RULES}
    assert by_name["clone3"].error == errno.ENOSYS  # glibc falls back to clone
    assert by_name["clone3"].masks == ()
    unshare = {mask for mask, _ in by_name["unshare"].masks}
    assert seccomp.CLONE_NEWUSER in unshare and seccomp.CLONE_NEWTIME in unshare
    clone = {mask for mask, _ in by_name["clone"].masks}
    assert clone == set(seccomp.CLONE_NAMESPACES)  # not 0x80: clone's exit signal byte
    # personality: the unsafe flags only, never the query 0xffffffff
    for mask, value in by_name["personality"].masks:
        assert 0xFFFFFFFF & mask != value


def test_without_seccomp_in_the_kernel_the_job_runs_and_says_so(monkeypatch):
    monkeypatch.setattr(seccomp, "kernel_has_seccomp", lambda: False)
    assert seccomp.build() == (None, seccomp.MISSING_KERNEL)


CHILD = r"""
import ctypes, errno, json, os, sys, threading
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import launch
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(*args):
    r = libc.syscall(*args)
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
launch.drop_privileges()
launch.load_filter(bytes.fromhex(sys.stdin.read()))
out = {}
pid = os.fork()
if pid == 0:
    os._exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())
out["unshare_user"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
out["unshare_fs"] = "ok" if libc.unshare(0x200) == 0 else errno.errorcode[ctypes.get_errno()]
out["clone3"] = call(435, None, 0)
out["keyctl"] = call(250, 0, -4, 0)
out["mount"] = call(165, b"none", b"/mnt", b"tmpfs", 0, None)
out["bpf"] = call(321, 0, None, 0)
out["personality_query"] = call(135, 0xFFFFFFFF)
out["personality_rie"] = call(135, 0x0400000)
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["thread"] = "ok"
print(json.dumps(out))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_the_built_filter_refuses_on_a_real_process_and_leaves_the_rest(tmp_path):
    bpf, missing = seccomp.build()
    if bpf is None:
        pytest.skip(missing or "no filter")
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", CHILD, launch.__file__],
        input=bpf.hex(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["unshare_user"] == errno.EPERM
    assert out["unshare_fs"] == "ok"  # no namespace flag: allowed
    assert out["clone3"] == "ENOSYS"
    assert out["keyctl"] == "EPERM" and out["mount"] == "EPERM" and out["bpf"] == "EPERM"
    assert out["personality_query"] == "ok" and out["personality_rie"] == "EPERM"
    assert out["thread"] == "ok"


def test_the_launch_environment_carries_the_jobs_variables_inert():
    argv, env = confine.launch(
        ["python", "train.py"],
        {"LD_PRELOAD": "/x.so", "PYTHONPATH": "/evil", "PATH": "/job/bin"},
        "/opt/ml/code",
        "/proc/7/ns/mnt",
        b"\x00" * 8,
    )
    assert argv == [*confine.launcher_argv(), "--", "python", "train.py"]
    # compiled, or Python with no PYTHON* variable and no site
    assert len(argv) == 4 or argv[1:3] == ["-I", "-S"]
    assert confine.python_launcher_argv()[1:3] == ["-I", "-S"]
    # nothing a loader, libc or interpreter reads: only PATH, the plan and the carried
    assert "LD_PRELOAD" not in env and "PYTHONPATH" not in env and env["PATH"] == os.defpath
    assert set(env) == {"PATH", confine.PLAN} | {
        launch.ENV_PREFIX + n for n in ("LD_PRELOAD", "PYTHONPATH", "PATH")
    }
    plan = launch.decode_plan(env[confine.PLAN])
    assert plan == {"mnt": b"/proc/7/ns/mnt", "cwd": b"/opt/ml/code", "seccomp": b"\0" * 8}
    # the launcher gives the job exactly its variables back, plus its process name
    back = launch.job_environment({**env, "SHIPYARD_PROCESS_NAME": "user"})
    assert back == {
        "LD_PRELOAD": "/x.so",
        "PYTHONPATH": "/evil",
        "PATH": "/job/bin",
        "SHIPYARD_PROCESS_NAME": "user",
    }
    assert confine.PLAN == launch.PLAN and confine.ENV_PREFIX == launch.ENV_PREFIX


def test_a_bind_is_made_by_the_launcher_and_kept_when_launched():
    argv = confine.with_binds(["ps-task"], [("/jobs/j/instances/algo-1/model", "/opt/ml/model")])
    launched, _ = confine.launch(argv, {}, "/", None, None)
    assert launched == argv  # not wrapped twice
    binds, program = launch.parse(launched[len(confine.launcher_argv()) :])
    assert binds == [("/jobs/j/instances/algo-1/model", "/opt/ml/model")]
    assert program == ["ps-task"]
    with pytest.raises(ValueError, match="usage"):
        launch.parse(["ps-task"])


def test_the_launcher_says_what_failed_and_exits_125(tmp_path):
    plan = launch.encode_plan({"cwd": os.fsencode(tmp_path / "missing")})
    env = {confine.PLAN: plan, "PATH": os.defpath}
    done = subprocess.run(
        [*confine.launcher_argv(), "--", "true"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 125
    assert "cannot change directory to" in done.stderr and "missing" in done.stderr


REPORT = "pwd; env | sort; grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status"


def _both_launchers() -> list[list[str]]:
    compiled = launchbin.path()
    if compiled is None:
        pytest.skip("no C compiler or private cache here: the Python launcher runs alone")
    return [confine.python_launcher_argv(), [compiled]]


def _launched(launcher: list[str], plan: dict[str, bytes], env: dict[str, str], *program: str):
    full = {confine.PLAN: launch.encode_plan(plan), "PATH": os.defpath, **env}
    return subprocess.run(
        [*launcher, "--", *program], env=full, capture_output=True, text=True, timeout=60
    )


def test_the_compiled_launcher_does_what_the_python_one_does(tmp_path):
    """Issue 40: ``python -I -S launch.py`` was 20-30 ms of CPU per job process; the
    compiled launcher (launch.c) must leave a process exactly as the Python one does:
    its view's mount namespace, its directory, no capability, no_new_privs, the seccomp
    filter, the job's variables only (searched in the job's PATH), and the same failures."""
    bpf, _ = seccomp.build()
    plan = {"cwd": os.fsencode(tmp_path)}
    if os.geteuid() == 0:  # joining a mount namespace needs CAP_SYS_ADMIN
        plan["mnt"] = b"/proc/self/ns/mnt"
    if bpf:
        plan["seccomp"] = bpf
    carried = {
        launch.ENV_PREFIX + "PATH": "/nowhere:/usr/bin:/bin",
        launch.ENV_PREFIX + "LD_PRELOAD": "",
        launch.ENV_PREFIX + "AB": "c=d",
        "SHIPYARD_PROCESS_NAME": "user",
    }
    runs = []
    for launcher in _both_launchers():
        ok = _launched(launcher, plan, carried, "sh", "-c", REPORT)
        missing_dir = _launched(launcher, {"cwd": os.fsencode(tmp_path / "no")}, {}, "true")
        missing_program = _launched(launcher, plan, carried, "no-such-program")
        usage = subprocess.run([*launcher, "true"], capture_output=True, text=True)
        runs.append(
            [(r.returncode, r.stdout, r.stderr) for r in (ok, missing_dir, missing_program, usage)]
        )
    python, compiled = runs
    assert compiled == python
    assert python[0][0] == 0 and "NoNewPrivs:\t1" in python[0][1]
    assert "CapBnd:\t0000000000000000" in python[0][1] and "\nAB=c=d\n" in python[0][1]
    assert confine.PLAN not in python[0][1] and (not bpf or "Seccomp:\t2" in python[0][1])
    assert [r[0] for r in python[1:]] == [125, 127, 125]


def test_a_compiled_launcher_anyone_could_have_written_is_not_run(tmp_path, monkeypatch):
    _both_launchers()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(launchbin, "_FOUND", [])
    built = launchbin.path()
    assert built is not None and built.startswith(str(tmp_path))
    assert launchbin.trusted(built)
    os.chmod(built, 0o777)  # writable by others
    assert not launchbin.trusted(built)
    os.chmod(built, 0o700)
    os.chmod(os.path.dirname(built), 0o777)  # its directory writable by others
    assert not launchbin.trusted(built)
    os.chmod(os.path.dirname(built), 0o700)
    link = tmp_path / "link"
    link.symlink_to(built)
    assert not launchbin.trusted(str(link))


def test_masks_follow_runc_and_keep_the_instances_own_files():
    keys = masks.view_keys()
    for path in ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"):
        assert path in keys["proc_mask"]
    for path in ("/proc/irq", "/proc/bus", "/proc/fs", "/proc/sys", "/proc/sysrq-trigger"):
        assert path in keys["proc_read_only"]
    assert "/etc/shadow" in keys["secrets"] and "/etc/gshadow" in keys["secrets"]
    assert all(not os.path.islink(p) for p in keys["fresh"])  # /var/run -> /run: once
    assert all(any(masks._under(p, top) for top in keys["fresh"]) for p in keys["keep_own"])


def _no_compiler(monkeypatch):
    """libseccomp's binding made unimportable and the compiler refusing to run."""
    monkeypatch.setitem(sys.modules, "pyseccomp", None)

    def refuse():
        raise AssertionError("compiled again where the cached program should be read")

    monkeypatch.setattr(seccomp, "compile_filter", refuse)


@pytest.mark.skipif(not seccomp.kernel_has_seccomp(), reason="no seccomp in this kernel")
def test_the_filter_is_compiled_once_per_machine_and_then_read_back(tmp_path, monkeypatch):
    """Issue 40: each agent imported libseccomp's binding (two ldconfig runs) to compile
    the same program; later agents read the first one's from the private cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first, why = seccomp.build()
    if first is None:
        pytest.skip(why or "no filter")
    cached = tmp_path / "shipyard" / seccomp.cache_name()
    assert cached.read_bytes() == first and oct(cached.stat().st_mode & 0o777) == "0o600"
    _no_compiler(monkeypatch)
    assert seccomp.build() == (first, None)


@pytest.mark.skipif(not seccomp.kernel_has_seccomp(), reason="no seccomp in this kernel")
@pytest.mark.parametrize("spoil", ["writable by others", "truncated", "a link", "empty"])
def test_a_cached_program_that_could_be_anyones_is_compiled_again(tmp_path, monkeypatch, spoil):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    good, why = seccomp.build()
    if good is None:
        pytest.skip(why or "no filter")
    cached = tmp_path / "shipyard" / seccomp.cache_name()
    if spoil == "writable by others":
        cached.write_bytes(b"\0" * 8)
        cached.chmod(0o666)
    elif spoil == "truncated":
        cached.write_bytes(good[:-3])
    elif spoil == "a link":
        other = tmp_path / "elsewhere.bpf"
        other.write_bytes(b"\0" * 8)
        cached.unlink()
        cached.symlink_to(other)
    else:
        cached.write_bytes(b"")
    compiled = []
    real = seccomp.compile_filter
    monkeypatch.setattr(seccomp, "compile_filter", lambda: compiled.append(1) or real())
    assert seccomp.build() == (good, None) and compiled == [1]
    assert cached.read_bytes() == good and not cached.is_symlink()  # replaced, whole


@pytest.mark.skipif(not seccomp.kernel_has_seccomp(), reason="no seccomp in this kernel")
def test_reading_the_cached_program_imports_nothing_heavy(tmp_path):
    """The cached program is read where each agent starts: neither the binding nor
    hashlib (OpenSSL), tempfile or pathlib (the bind shim's module) comes with it."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    code = (
        "import sys; from shipyard.sandbox import seccomp; bpf, why = seccomp.build(); "
        "heavy = ('pyseccomp', 'hashlib', 'tempfile', 'pathlib', 'shipyard.sandbox.bindshim'); "
        "print(bpf is not None, ' '.join(m for m in heavy if m in sys.modules))"
    )
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if not first.stdout.startswith("True"):
        pytest.skip(f"no filter here: {first.stdout} {first.stderr}")
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.stdout.split() == ["True"], again.stdout + again.stderr


def test_a_failing_compiler_is_tried_once_per_launcher_version(tmp_path, monkeypatch):
    """A compiler that cannot build the launcher (no kernel headers, say) would cost every
    agent of every job a failed build; the failure is remembered beside the binary."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    tries: list[str] = []

    def failing(target: str) -> bool:
        tries.append(target)
        return False

    monkeypatch.setattr(launchbin, "_compile", failing)
    for _ in range(3):
        monkeypatch.setattr(launchbin, "_FOUND", [])
        assert launchbin.path() is None
    assert len(tries) == 1
    assert confine.launcher_argv() == confine.python_launcher_argv()
