"""The pure parts of issue 31's sandbox: the filesystem view and the confinement argv."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from shipyard.sandbox import confine, fsview


@dataclass
class Config:
    instances_dir: str
    shared_dir: str | None = None
    channel_sources: dict[str, str] = field(default_factory=dict)
    extra_python_path: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    hyperparameters: dict[str, str] = field(default_factory=dict)


def test_view_hides_the_home_and_keeps_the_job_its_python_and_local_channels(tmp_path):
    # a home outside /tmp (under the private /tmp it is not there anyway)
    base = tmp_path.relative_to("/tmp") if str(tmp_path).startswith("/tmp/") else tmp_path
    home = Path("/srv/shipyard-test") / base / "home"
    data = tmp_path / "data"
    data.mkdir()
    config = Config(
        instances_dir=str(home / "jobs" / "j" / "instances"),
        shared_dir=str(home / "jobs" / "j" / "shared"),
        channel_sources={"train": str(data), "s3": "s3://bucket/key", "f": f"file://{data}"},
        extra_python_path=["/opt/deps"],
    )
    view = fsview.view(config, python=["/root/.pyenv/versions/3.11", "/srv/venv"])
    assert str(home) in view["mask"] and "/root" in view["mask"] and "/home" in view["mask"]
    assert "/dev/shm" in view["mask"] and view["private_tmp"] == ["/tmp"]
    assert view["sticky"] == ["/dev/shm", "/tmp"]  # its own, mode 1777
    # the instances' trees and the shared dir, never the job's records beside them
    jobdir = home / "jobs" / "j"
    assert view["keep_rw"] == [str(jobdir / "instances"), str(jobdir / "shared")]
    assert view["keep_ro"] == sorted(
        {"/root/.pyenv/versions/3.11", "/srv/venv", "/opt/deps", str(data)}
    )
    assert "s3://bucket/key" not in str(view)
    # the whole system behind a throw-away layer; the usual places where that fails
    assert view["root_overlay"] is True and "/etc" in view["overlay"]
    assert "/usr/local" in view["overlay"] and "/var" in view["overlay"]
    assert {"/opt/ml", "/etc/hosts", "/dev"} <= set(view["writable"])
    assert "null" in view["devices"] and "nvidia*" in view["devices"]
    assert not any(d.startswith(("sd", "vd", "nvme")) for d in view["devices"])  # no disks


def test_paths_the_spec_names_under_tmp_are_kept_writable_and_nothing_else(tmp_path):
    """A script handed a host path under /tmp (pytest's tmp_path, a marker directory two
    instances share) still finds it in its private /tmp, and one that does not exist yet is
    reachable through its nearest existing directory; a list such as PATH, /tmp itself, and the shipyard home or a directory holding it are not
    bound (the view would reveal other jobs)."""
    import json

    home = tmp_path / "home"
    (home / "jobs" / "j" / "instances").mkdir(parents=True)
    markers, named, outs = tmp_path / "markers", tmp_path / "named", tmp_path / "outs"
    markers.mkdir()
    named.mkdir()
    outs.mkdir()
    config = Config(instances_dir=str(home / "jobs" / "j" / "instances"))
    config.environment = {  # type: ignore[attr-defined]
        "MARKER_DIR": str(markers),
        "PATH": f"{markers}:/usr/bin",
        "GONE": str(tmp_path / "gone"),
        "TMP": "/tmp",
        "HOME_OF_ALL": str(home),
        "ABOVE_HOME": str(tmp_path),
        "ETC": "/etc",
        "NOT_YET": str(outs / "run-1" / "out"),  # created by the job: its nearest directory
    }
    config.hyperparameters = {"out": json.dumps(str(named)), "lr": "0.1"}  # type: ignore[attr-defined]
    view = fsview.view(config, python=["/srv/venv"])
    assert view["keep_rw"] == sorted(
        [str(home / "jobs" / "j" / "instances"), str(markers), str(named), str(outs)]
    )
    assert str(home) not in view["mask"]  # under the private /tmp: not there anyway


def test_a_job_dir_outside_a_jobs_folder_masks_no_home(tmp_path):
    (tmp_path / "x" / "instances").mkdir(parents=True)
    view = fsview.view(Config(instances_dir=str(tmp_path / "x" / "instances")), python=[])
    assert str(tmp_path) not in view["mask"]


def test_masks_nested_in_another_mask_are_one():
    assert fsview._outermost(["/root", "/root/.shipyard", "/home", "/home/"]) == [
        "/home",
        "/root",
    ]


def test_confinement_drops_every_capability_and_is_not_applied_twice():
    argv, note = confine.confined_argv(["python", "train.py"])
    assert note is None
    assert argv[-3:] == ["--", "python", "train.py"] and argv[1:-3] == confine.DROP_ALL
    # a runner that confined its program after a privileged set-up step keeps its chain
    wrapped = ["unshare", "--mount", "--", "/bin/sh", "-c", "mount ... && exec $@", *argv]
    assert confine.confined_argv(wrapped) == (wrapped, None)
    assert confine.confined(wrapped) and not confine.confined(["python", "train.py"])


def test_without_setpriv_the_job_runs_and_the_note_says_so(monkeypatch):
    monkeypatch.setattr(confine.tools, "find", lambda name: None)
    argv, note = confine.confined_argv(["python", "train.py"])
    assert argv == ["python", "train.py"] and note is not None and "setpriv" in note


def test_doctor_names_each_missing_protection_with_its_fix(monkeypatch):
    from shipyard.sandbox import probe, seccomp

    monkeypatch.setattr(seccomp, "build", lambda: (None, seccomp.MISSING_LIBRARY))
    gaps = dict(probe.isolation_gaps())
    assert gaps[seccomp.MISSING_LIBRARY] == "apt-get install libseccomp2 && pip install pyseccomp"
    monkeypatch.undo()
    monkeypatch.setattr(seccomp, "kernel_has_seccomp", lambda: False)
    gaps = dict(probe.isolation_gaps())
    assert gaps[seccomp.MISSING_KERNEL] == "a kernel with CONFIG_SECCOMP_FILTER"


def test_describe_lists_each_instances_missing_protections(tmp_path):
    import json

    from shipyard.control.disk_full import NO_VOLUME
    from shipyard.control.job_end import missing_protections
    from shipyard.jobplan.layout import InstancePaths

    for host, missing in (("algo-1", ["no PID namespace: the kernel refused one (EPERM)"]),):
        path = InstancePaths(str(tmp_path / "instances" / host)).missing_protections_file
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as fh:
            json.dump(missing, fh)
    assert missing_protections(str(tmp_path), ["algo-1", "algo-2"]) == [
        {"Host": "algo-1", "Missing": NO_VOLUME},
        {"Host": "algo-1", "Missing": "no PID namespace: the kernel refused one (EPERM)"},
        {"Host": "algo-2", "Missing": NO_VOLUME},
    ]


def test_a_framework_environment_is_kept_read_only(tmp_path):
    """The job's processes run the environment's interpreter: it lies under the masked home,
    so the view binds it back, read-only."""
    home = tmp_path / "home"
    (home / "jobs" / "j" / "instances").mkdir(parents=True)
    env = home / "environments" / "tensorflow-cpu-2.13.1-abc"
    config = Config(instances_dir=str(home / "jobs" / "j" / "instances"))
    config.python = str(env / "bin" / "python")  # type: ignore[attr-defined]
    view = fsview.view(config, python=["/srv/venv"])
    assert str(env) in view["keep_ro"] and str(env) in view["read_only"]


def test_checkpoint_local_path_stays_writable_and_shared(tmp_path):
    """checkpoint_local_path is a host directory every instance writes and a retry reads:
    under a masked home it is bound back, read-write."""
    home = tmp_path / "home"
    (home / "jobs" / "j" / "instances").mkdir(parents=True)
    config = Config(instances_dir=str(home / "jobs" / "j" / "instances"))
    config.checkpoint_local_path = str(tmp_path / "ckpt")  # type: ignore[attr-defined]
    view = fsview.view(config, python=["/srv/venv"])
    assert str(tmp_path / "ckpt") in view["keep_rw"]


def test_the_instance_init_starts_without_json_re_or_glob():
    """Issue 40: one init per instance, all started at once; ``json``, ``re`` (and the
    ``enum`` behind it) and ``glob`` were a third of its start-up."""
    import subprocess
    import sys

    from shipyard.sandbox import pidns

    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import init; "
        "print(' '.join(m for m in ('json', 're', 'glob', 'enum') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe, os.path.dirname(pidns.INIT)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == []


def test_the_view_reaches_the_init_whole_and_its_answer_comes_back():
    from shipyard.sandbox import viewbuild

    odd = ["/a b/c,d;e=f", "/tmp/ü", os.fsdecode(b"/x\xff"), ""]
    view = {"root_overlay": True, "overlay": [], "mask": odd, "keep_ro": ["/x"], "off": False}
    text = viewbuild.encode_view(view)
    assert "\n" not in text and "\0" not in text
    decoded = viewbuild.decode_view(text)
    assert decoded["mask"] == odd[:3]  # an empty path names nothing: dropped
    assert decoded["root_overlay"] == ["1"] and decoded["off"] == [] and decoded["overlay"] == []
    assert decoded["keep_ro"] == ["/x"]
    answer = viewbuild.encode_view({"missing": ["/proc/kcore is visible: EPERM; ok"]})
    assert viewbuild.decode_view(answer)["missing"] == ["/proc/kcore is visible: EPERM; ok"]
    assert viewbuild.decode_view("") == {}


def test_mountinfo_escapes_are_decoded_without_re():
    from shipyard.sandbox.viewbuild import unescape

    assert unescape(r"/mnt/a\040b\011c\012d\134e") == "/mnt/a b\tc\nd\\e"
    assert unescape("/plain") == "/plain"
    assert unescape(r"/odd\09x\1") == r"/odd\09x\1"  # not an escape: kept


def test_the_agent_expands_the_views_patterns_for_the_init(tmp_path, monkeypatch):
    from shipyard.sandbox import pidns

    (tmp_path / "ssh_host_rsa_key").write_text("")
    (tmp_path / "ssh_host_rsa_key.pub").write_text("")
    view = {
        "devices": ["null", "zero", "nvidia*", "no-such-device"],
        "secrets": [str(tmp_path / "ssh_host_*key"), str(tmp_path / "absent")],
        "mask": ["/home"],
    }
    expanded = pidns.expand_patterns(view)
    assert expanded["secrets"] == [str(tmp_path / "ssh_host_rsa_key")]
    assert {"null", "zero"} <= set(expanded["devices"])
    assert "no-such-device" not in expanded["devices"]
    assert not any("*" in d for d in expanded["devices"])
    assert expanded["mask"] == ["/home"] and view["devices"][2] == "nvidia*"  # not changed


def test_the_init_script_is_small_and_builds_the_view_from_cached_bytecode():
    """Python compiles a script run by path at every start (the init's 500 lines cost
    5-6 ms of CPU per instance); the mounting is a module, read from its bytecode."""
    import subprocess
    import sys

    from shipyard.sandbox import pidns

    with open(pidns.INIT, encoding="utf-8") as fh:
        assert len(fh.read()) < 4000
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import init; "
        "print(type(init.viewbuild.__loader__).__name__, init.viewbuild.build.__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe, os.path.dirname(pidns.INIT)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["SourceFileLoader", "build"]


def test_star_patterns_expand_as_glob_does_without_it(tmp_path, monkeypatch):
    """The view's patterns (``nvidia*``, ``ssh_host_*key``) are expanded in every
    sandboxed agent: glob's regular expressions are not needed for them."""
    import glob
    import sys

    names = "a ab abc .ab xay nvidia0 nvidiactl nvidia-uvm ssh_host_rsa_key "
    names += "ssh_host_rsa_key.pub ssh_host_ed25519_key aa"
    for name in names.split():
        (tmp_path / name).write_text("")
    patterns = "nvidia* * ssh_host_*key a*b*c *a* .a* a* *key x*y* ** a*a ab*b* none*".split()
    expected = {p: sorted(glob.glob(f"{tmp_path}/{p}")) for p in patterns}
    expected["[ab]*"] = sorted(glob.glob(f"{tmp_path}/[ab]*"))
    from shipyard.sandbox import viewbuild

    assert viewbuild.expand(f"{tmp_path}/[ab]*") == expected["[ab]*"]  # glob's, still
    monkeypatch.setitem(sys.modules, "glob", None)
    for pattern in patterns:
        assert viewbuild.expand(f"{tmp_path}/{pattern}") == expected[pattern], pattern
    assert viewbuild.expand(f"{tmp_path}/missing/x*") == []


def test_the_s3_endpoint_port_is_read_as_urllib_reads_it():
    from urllib.parse import urlsplit

    from shipyard.agent.__main__ import url_host_port

    urls = [
        "http://127.0.0.1:9000",
        "http://localhost:9000/bucket?x=1",
        "https://LOCALHOST/",
        "http://[::1]:9100/",
        "http://[::1]",
        "http://user:pw@127.0.0.1:8080/p",
        "https://s3.example.com",
        "http://127.0.0.1:9000#frag",
    ]
    for url in urls:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        assert url_host_port(url) == (parts.hostname, port), url
    assert url_host_port("http://127.0.0.1:port/") is None
    assert url_host_port("http://127.0.0.1:70000/") is None
    assert url_host_port("127.0.0.1:9000") is None  # not a URL
