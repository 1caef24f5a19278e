"""An endpoint's inference code runs confined (issue 37): the model a training job wrote
holds its author's code, so the model server's workers get what that author's training
instance got. A probing inference.py answers, from inside a worker, what it can see and
do; the host side checks what it cannot (the master's environment, the worker's cgroup).
Real endpoints, real namespaces; each case fails on a model server run as a host process."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
import urllib.error
import urllib.request

import psutil
import pytest

from shipyard.control.endpoints import Endpoints
from shipyard.sandbox import probe

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not probe.support(network=False).ok, reason="this machine cannot unshare namespaces"
    ),
]

PROBE = textwrap.dedent(
    """
    import json
    import os

    def model_fn(model_dir):
        return model_dir

    def input_fn(body, content_type):
        return json.loads(body)

    def predict_fn(data, model_dir):
        status = dict(l.split(":", 1) for l in open("/proc/self/status"))
        home, marker = data["home"], data["marker"]
        return {
            "cap_eff": status["CapEff"].strip(),
            "no_new_privs": status["NoNewPrivs"].strip(),
            "ppid": os.getppid(),
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "init": open("/proc/1/cmdline").read().replace("\\0", " "),
            "host_tmp_marker": os.path.exists(marker),
            "home_db": os.path.exists(os.path.join(home, "shipyard.db")),
            "home_endpoints": os.path.exists(os.path.join(home, "endpoints")),
            "model_dir": model_dir,
            "model": sorted(os.listdir("/opt/ml/model")) if os.path.isdir("/opt/ml/model") else None,
            "env": os.environ.get("PROBE_VAR"),
            "creator_key": os.environ.get("AWS_SECRET_ACCESS_KEY"),
        }
    """
)


@pytest.fixture
def outside_home(monkeypatch):
    """A SHIPYARD_HOME outside /tmp (the private /tmp alone would hide one under it)."""
    path = tempfile.mkdtemp(prefix="shipyard-home-", dir="/var/tmp")
    monkeypatch.setenv("SHIPYARD_HOME", path)
    yield path
    for record in Endpoints(path).list():
        Endpoints(path).delete(record.name)
    shutil.rmtree(path, ignore_errors=True)


def _model(root: str) -> str:
    model = os.path.join(root, "model")
    os.makedirs(os.path.join(model, "code"))
    with open(os.path.join(model, "weights.txt"), "w") as fh:
        fh.write("w")
    with open(os.path.join(model, "code", "inference.py"), "w") as fh:
        fh.write(PROBE)
    return model


def _ask(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url + "/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # the inference code's error, in the failure
        raise AssertionError(exc.read().decode(errors="replace")) from None


def test_inference_code_runs_without_privileges_in_its_own_pid_namespace_and_view(
    outside_home, tmp_path, monkeypatch
):
    # the creating process's key (shipyard server's, a notebook user's): never the code's
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "creator-secret")
    marker = tmp_path / "host-tmp-marker"  # under the host's /tmp
    marker.write_text("host")
    eps = Endpoints(outside_home)
    eps.create("confined", _model(str(tmp_path)), framework="python", env={"PROBE_VAR": "v"})
    record = eps.wait("confined", timeout=120)
    seen = _ask(record.url, {"home": outside_home, "marker": str(marker)})

    assert int(seen["cap_eff"], 16) == 0  # no capability
    assert seen["no_new_privs"] == "1"  # and no way to gain one
    assert seen["ppid"] == 0  # its parent is outside its PID namespace
    assert "shipyard/sandbox/init.py" in seen["init"]  # pid 1 is the instance's init
    assert len(seen["pids"]) <= 4  # init, the worker (and /proc's own reader)
    assert not seen["host_tmp_marker"]  # the host's /tmp is not its /tmp
    assert not seen["home_db"] and not seen["home_endpoints"]  # $SHIPYARD_HOME hidden
    assert seen["model_dir"] == "/opt/ml/model"
    assert seen["model"] == ["code", "weights.txt"]
    assert seen["env"] == "v"  # the model's environment reaches the worker ...
    assert seen["creator_key"] is None  # ... the creating process's keys do not
    master = psutil.Process(record.pid)
    assert "PROBE_VAR" not in master.environ()  # ... and not the privileged master
    described = eps.get("confined").describe()["Shipyard"]
    assert any(m.startswith("network:") for m in described["MissingProtections"])


def test_workers_are_in_the_instance_types_cgroup(outside_home, tmp_path):
    eps = Endpoints(outside_home)
    eps.create("typed", _model(str(tmp_path)), framework="python", instance_type="ml.c5.large")
    record = eps.wait("typed", timeout=120)
    described = eps.get("typed").describe()["Shipyard"]
    assert described["InstanceType"] == "ml.c5.large"
    workers = [
        p
        for p in psutil.Process(record.pid).children()
        if "shipyard.serving.worker" in " ".join(p.cmdline())
    ]
    assert len(workers) == 1
    if described["Resources"]["Cgroups"] is None:  # this machine gives no cgroups: said
        assert any(m.startswith("limits:") for m in described["MissingProtections"])
        return
    assert described["Resources"]["Instances"]["algo-1"]["MemoryBytes"] > 0
    with open(f"/proc/{workers[0].pid}/cgroup", encoding="ascii") as fh:
        assert "endpoint-typed/algo-1" in fh.read()
    eps.delete("typed")
    assert not [
        line for line in open("/proc/self/mountinfo", encoding="utf-8") if "endpoint-typed" in line
    ]


def test_sandbox_off_still_serves_and_says_what_is_missing(outside_home, tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_SANDBOX", "off")
    eps = Endpoints(outside_home)
    eps.create("open", _model(str(tmp_path)), framework="python")
    record = eps.wait("open", timeout=120)
    seen = _ask(record.url, {"home": outside_home, "marker": "/nonexistent"})
    assert seen["model_dir"].endswith("/endpoints/open/model")  # the host's path, as before
    assert int(seen["cap_eff"], 16) == 0  # setpriv still drops the capabilities
    missing = eps.get("open").describe()["Shipyard"]["MissingProtections"]
    assert any("instance sandbox off (SHIPYARD_SANDBOX=off)" in m for m in missing)
    with open(record.log_path, encoding="utf-8") as fh:
        assert "protection missing: instance sandbox off" in fh.read()
