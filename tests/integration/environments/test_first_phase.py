"""A framework environment is the job's first phase (issue 28): submission returns at once,
the supervisor builds (or finds) the environment before any instance starts, with the job
InProgress/Downloading and a StatusMessage naming it; the job's requirements.txt goes into
the same resolve; a failed build fails the job before any instance starts naming the
package and the registry's answer; a stopped build leaves nothing half-built.

Real uv, the real registry, real job processes. The one stand-in is data at the resolver's
table of frameworks (``resolver.FRAMEWORKS``): "TensorFlow" there is the tiny pure-Python
``six``, so each build downloads kilobytes (shipyard's own in-instance dependencies come
from uv's cache) instead of several hundred MB; the TensorFlow build itself is
test_job_environment.py's, the suite's one real framework build.
"""

from __future__ import annotations

import fcntl
import http.server
import os
import socketserver
import threading
import time

import pytest

import shipyard
from shipyard.environments import builder, resolver
from shipyard.environments import job as framework_envs

pytest.importorskip("uv")
pytestmark = [pytest.mark.timeout(600)]

SIX_AS_TENSORFLOW = resolver.Framework(
    display="TensorFlow (six)",
    package="six",
    generations=(resolver.Generation("six 1", (1, 0), (1, 99)),),
    supported=((1, 14), (1, 17)),
)
SCRIPT = """
import os, sys
import six
print("six", six.__version__, "prefix", sys.prefix, flush=True)
if os.path.exists("requirements.txt") or os.environ.get("WANT_IDNA"):
    import idna
    print("idna", idna.__version__, flush=True)
"""


@pytest.fixture
def six_env(monkeypatch, tmp_path):
    monkeypatch.setitem(resolver.FRAMEWORKS, "tensorflow", SIX_AS_TENSORFLOW)
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_ENVS", "auto")  # the default, said explicitly
    root = tmp_path / "envs"
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", str(root))
    return root


def _estimator(session, src, **kw):
    return shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        framework_version=kw.pop("framework_version", "1.16.0"),
        session=session,
        **kw,
    )


def _statuses(desc):
    return [(t["Status"], t["StatusMessage"]) for t in desc["SecondaryStatusTransitions"]]


def _submit(est, name):
    control = est.session.control
    control.submit(est._job_spec(None, name))
    return control


def test_submission_returns_before_the_build_and_the_first_phase_builds_it(
    six_env, session, write_script, capsys, monkeypatch
):
    src = write_script("train.py", SCRIPT)
    control = _submit(_estimator(session, src), "six-built")
    # accepted at once: recorded, nothing queried or built yet
    record = control.get("six-built")
    assert (record.status, record.secondary_status) == ("InProgress", "Starting")
    assert not six_env.exists()
    assert control.describe("six-built")["Shipyard"]["FrameworkEnvironment"]["Asked"] == "1.16.0"

    record = control.run("six-built", stream=__import__("sys").stdout)
    desc = control.describe("six-built")
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    statuses = _statuses(desc)
    messages = [m for _, m in statuses]
    building = [m for s, m in statuses if s == "Downloading" and "six==1.16.0" in m]
    assert building and building[0].startswith("Building the framework environment six==1.16.0")
    assert messages.index(building[0]) < [s for s, _ in statuses].index("Training")
    out = capsys.readouterr().out
    assert "six 1.16.0 prefix " + str(six_env) in out
    env = desc["Shipyard"]["FrameworkEnvironment"]
    assert (env["Asked"], env["Version"], env["Exact"]) == ("1.16.0", "1.16.0", True)
    assert env["Python"].startswith(str(six_env))
    with open(desc["Shipyard"]["Instances"][0]["LogPath"], encoding="utf-8") as fh:
        first = fh.readline()
    assert "Building the framework environment six==1.16.0" in first
    # nothing of the build is left beside the environment
    left = os.listdir(six_env)
    assert [n for n in left if not n.startswith(".")] == [
        os.path.basename(os.path.dirname(os.path.dirname(env["Python"])))
    ]
    assert not [n for n in left if n.startswith(".build-")]

    # the next job asking the same finds it in the cache, with no registry query (the
    # registry is unreachable now: the version an earlier job was built with is reused)
    monkeypatch.setenv("UV_DEFAULT_INDEX", "http://127.0.0.1:9/simple")
    est = _estimator(session, src)
    est.fit(job_name="six-cached", logs=False)
    desc = est.latest_training_job.describe()
    assert any(
        m.startswith("Using the cached framework environment six==1.16.0")
        for _, m in _statuses(desc)
    )
    assert desc["Shipyard"]["FrameworkEnvironment"]["Python"] == env["Python"]


def test_requirements_txt_goes_into_the_framework_environment(
    six_env, session, write_script, capsys
):
    src = write_script("train.py", SCRIPT)
    write_script("requirements.txt", "idna==3.4\n")
    est = _estimator(session, src)
    est.fit(job_name="six-with-reqs")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    out = capsys.readouterr().out
    assert "six 1.16.0" in out and "idna 3.4" in out
    assert any("six==1.16.0 + the job's requirements.txt" in m for _, m in _statuses(desc))
    # installed in the environment, not in staging's overlay for the installed interpreter
    assert "requirements.txt installed in cached environment" not in out
    assert desc["Shipyard"]["FrameworkEnvironment"]["Python"].startswith(str(six_env))


def test_a_build_that_fails_fails_the_job_before_any_instance_naming_the_package(
    six_env, session, write_script
):
    from shipyard.errors import JobFailedError

    src = write_script("train.py", SCRIPT)
    write_script("requirements.txt", "shipyard-no-such-package-28==1.0\n")
    est = _estimator(session, src)
    with pytest.raises(JobFailedError):
        est.fit(job_name="six-bad-reqs", logs=False)
    desc = est.latest_training_job.describe()
    reason = desc["FailureReason"]
    assert (
        "TensorFlow framework_version '1.16.0'" in reason or "framework_version '1.16.0'" in reason
    )
    assert "shipyard-no-such-package-28" in reason and "uv exited with" in reason
    assert desc["Shipyard"]["Instances"] == []
    assert [n for n in os.listdir(six_env) if not n.endswith(".lock")] == []


def test_a_version_the_registry_lacks_fails_the_job_naming_what_it_has(
    six_env, session, write_script
):
    from shipyard.errors import JobFailedError

    est = _estimator(session, write_script("train.py", SCRIPT), framework_version="2.0")
    with pytest.raises(JobFailedError):
        est.fit(job_name="six-refused", logs=False)
    desc = est.latest_training_job.describe()
    assert "framework_version '2.0'" in desc["FailureReason"]
    assert "no six 2.0 for Python" in desc["FailureReason"]
    assert desc["Shipyard"]["Instances"] == []


class _Stalled(socketserver.ThreadingTCPServer):
    """A registry that accepts and never answers: uv waits on it until it is killed."""

    daemon_threads = True
    allow_reuse_address = True


class _Hang(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the handler's API
        self.server.hit.set()  # type: ignore[attr-defined]
        time.sleep(120)

    def log_message(self, *args):
        pass


def test_a_stopped_build_ends_the_job_stopped_and_leaves_nothing(six_env, session, write_script):
    stalled = _Stalled(("127.0.0.1", 0), _Hang)
    stalled.hit = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=stalled.serve_forever, daemon=True).start()
    port = stalled.server_address[1]
    try:
        src = write_script("train.py", SCRIPT)
        # the job's own index: uv asks it for idna and waits
        write_script("requirements.txt", f"--index-url http://127.0.0.1:{port}/simple\nidna==3.4\n")
        control = _submit(_estimator(session, src), "six-stopped")

        def stop_once_uv_asks() -> None:
            if stalled.hit.wait(300):  # type: ignore[attr-defined]
                control.store.request_stop("six-stopped")  # what StopTrainingJob does

        threading.Thread(target=stop_once_uv_asks, daemon=True).start()
        record = control.run("six-stopped")
    finally:
        stalled.shutdown()
        stalled.server_close()
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    desc = control.describe("six-stopped")
    assert desc["Shipyard"]["Instances"] == []
    assert any(m.startswith("Building the framework environment") for _, m in _statuses(desc))
    assert [n for n in os.listdir(six_env) if not n.endswith(".lock")] == []


def test_a_job_waiting_for_another_jobs_build_of_its_environment_can_be_stopped(
    six_env, session, write_script
):
    key = builder.env_key(
        ("six==1.16.0",),
        builder.RUNTIME_DEPS + builder.pinned_installed(framework_envs.PINNED),
        None,
    )
    six_env.mkdir(parents=True)
    with open(six_env / f".{key}.lock", "w") as held:  # "another job" is building it
        fcntl.flock(held, fcntl.LOCK_EX)
        control = _submit(_estimator(session, write_script("train.py", SCRIPT)), "six-waits")

        def stop_when_waiting() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if control.get("six-waits").secondary_status == "Downloading" and any(
                    "six==1.16.0" in t["message"] for t in control.store.transitions("six-waits")
                ):
                    control.store.request_stop("six-waits")
                    return
                time.sleep(0.1)

        threading.Thread(target=stop_when_waiting, daemon=True).start()
        record = control.run("six-waits")
    assert record.status == "Stopped"
    assert [n for n in os.listdir(six_env) if not n.startswith(".")] == []
