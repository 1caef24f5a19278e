"""``shipyard plan JOB --same-machine`` (issue 39): the rows `make demo` shows beside its
measured runs, from the same cached ceiling (links capped, cores shared, shipyard.ps' CPU
charged); ``--shared-host`` alone keeps a given core count and no ceiling. The job and
the ceiling are stand-ins, so this checks the wiring, not a measurement."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from shipyard.cli.app import app
from shipyard.planner import ceiling, model
from tests.unit.planner.test_transport_cost import _demo_run


@pytest.fixture
def job(monkeypatch):
    desc = _demo_run()

    class Plane:
        def describe(self, name):
            return desc

    monkeypatch.setattr("shipyard.control.client.ControlPlane", Plane)
    found = ceiling.Ceiling(
        ceiling.machine_key(), 18.5, 2.0, "t", ps_cpu_s_per_gb=0.9, ps_gbyte_per_s=1.0
    )
    monkeypatch.setattr(ceiling, "get", lambda home, refresh=False: found)
    return found


def _plan(*args: str):
    return CliRunner().invoke(app, ["plan", "j", "--json", *args], env={"COLUMNS": "200"})


def test_same_machine_rows_are_the_demo_s_figures(job):
    done = _plan("--instance-type", "ml.p2.8xlarge", "--instances", "2", "--same-machine")
    assert done.exit_code == 0, done.output
    got = json.loads(done.stdout)
    (row,) = got["rows"]
    machine = job.machine()
    from shipyard.planner.profile import Inputs, from_describe

    m = from_describe(_demo_run(), Inputs(machine=machine))
    link = model.Link("ml.p2.8xlarge", 10e9 / 8, framing=model.TCP_FRAMING)
    expected = model.same_machine(m.profile, link, 2, machine)
    assert row["steps_per_s"] == pytest.approx(expected.steps_per_s)
    assert row["bottleneck"] == "host CPU"
    assert "shipyard.ps 0.90 CPU-s per GB" in got["measured"]["sources"]["same_machine"]
    # without it: a real cluster's row, faster (cores of their own, no transport CPU)
    real = json.loads(_plan("--instance-type", "ml.p2.8xlarge", "--instances", "2").stdout)
    assert real["rows"][0]["steps_per_s"] > row["steps_per_s"]
    assert "same_machine" not in real["measured"]["sources"]


def test_same_machine_refuses_shared_host_and_an_unknown_ceiling(job, monkeypatch):
    both = _plan("--same-machine", "--shared-host", "2")
    assert both.exit_code == 2
    assert "--same-machine and --shared-host: give one" in both.output
    unknown = ceiling.Ceiling(ceiling.machine_key(), 18.5, 2.0, "t", ps_reason="shard exited")
    monkeypatch.setattr(ceiling, "get", lambda home, refresh=False: unknown)
    done = _plan("--instance-type", "ml.p2.8xlarge", "--instances", "2", "--same-machine")
    assert done.exit_code == 2
    assert "push/pull cost on this machine is unknown (shard exited)" in done.output
