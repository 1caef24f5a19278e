"""The "same machine" model (issue 39): an emulated run here gets min(emulated rate, this
machine's measured ceiling) and its workers share the machine's cores; without a ceiling
there is no figure, and the table says why. Fixed inputs, hand-computed, milliseconds."""

from __future__ import annotations

import json

import pytest

from shipyard.planner import ceiling, model, render
from shipyard.planner.profile import Inputs, from_describe
from tests.unit.planner.test_inputs import _desc

GBIT = 1e9 / 8  # bytes per second of one Gbit/s


def _ring(compute_s: float = 0.1, gradient: float = 1e8) -> model.Profile:
    return model.Profile("horovod", compute_s, (gradient,), fusion_bytes=0)


def test_the_emulated_rate_is_capped_at_the_ceiling():
    machine = model.Machine(cores=2, bytes_per_s=4 * GBIT)
    slow = model.Link("1.25gbit", 1.25 * GBIT, latency_s=0.0)
    fast = model.Link("10gbit", 10 * GBIT, latency_s=0.0)
    assert model.on_machine(slow, machine) is slow  # below the ceiling: as emulated
    assert model.on_machine(fast, machine).bytes_per_s == 4 * GBIT
    assert model.on_machine(fast, machine).name == "10gbit"


def test_a_capped_run_is_predicted_at_the_ceiling_and_named_host_network():
    # ring over 2 ranks: each NIC sends S = 1e8 bytes; 10 Gbit/s would take 0.08 s, the
    # machine's 4 Gbit/s takes 0.2 s; a collective's step is compute + communication
    machine = model.Machine(cores=2, bytes_per_s=4 * GBIT)
    fast = model.Link("10gbit", 10 * GBIT, latency_s=0.0)
    row = model.same_machine(_ring(), fast, 2, machine)
    assert row.comm_s == pytest.approx(0.2)
    assert row.step_s == pytest.approx(0.3)
    assert row.steps_per_s == pytest.approx(2 / 0.3)
    assert row.bottleneck == "host network"
    assert "4.0 Gbit/s between instances, below the emulated 10 Gbit/s" in row.advice
    # the plain model takes the emulated rate at its word: 0.18 s, 11.1 steps/s
    assert model.predict(_ring(), fast, 2).step_s == pytest.approx(0.18)


def test_an_uncapped_run_is_the_plain_model_with_the_cores_shared():
    machine = model.Machine(cores=2, bytes_per_s=40 * GBIT)
    link = model.Link("10gbit", 10 * GBIT, latency_s=0.0)
    row = model.same_machine(_ring(), link, 2, machine)
    assert row.step_s == pytest.approx(0.18) and row.bottleneck == "compute"


def test_workers_beyond_the_cores_stretch_the_compute():
    # 4 instances without a distribution on 2 cores: 4 x 0.1 s of compute per 2 cores is
    # 0.2 s a step; on 4 cores each worker has its own: 0.1 s
    plain = model.Profile("none", 0.1, (1.0,))
    link = model.Link("10gbit", 10 * GBIT)
    two = model.same_machine(plain, link, 4, model.Machine(2, 40 * GBIT))
    assert two.step_s == pytest.approx(0.2) and two.bottleneck == "host CPU"
    assert two.steps_per_s == pytest.approx(20.0)
    four = model.same_machine(plain, link, 4, model.Machine(4, 40 * GBIT))
    assert four.step_s == pytest.approx(0.1) and four.bottleneck == "compute"
    # a collective: only its compute phase is shared; 3 ranks on 2 cores: 0.15 + comm
    ring = model.same_machine(
        _ring(), model.Link("x", 10 * GBIT, 0.0), 3, model.Machine(2, 40 * GBIT)
    )
    assert ring.step_s == pytest.approx(0.15 + 2 * 2 / 3 * 1e8 / (10 * GBIT))


def test_without_a_ceiling_there_is_no_figure_and_the_cell_says_why():
    unknown = model.Machine(cores=2, bytes_per_s=None, why="tc: not in this test")
    link = model.Link("10gbit", 10 * GBIT, latency_s=0.0)
    with pytest.raises(
        model.Unpredictable, match=r"ceiling between instances is unknown \(tc: not"
    ):
        model.same_machine(_ring(), link, 2, unknown)
    cell = render.same_machine_cell(_ring(), link, 2, unknown)
    assert (
        cell.startswith("(no prediction: this machine's ceiling") and "tc: not in this test" in cell
    )
    assert render.same_machine_cell(_ring(), link, 2, model.Machine(2, 4 * GBIT)) == (
        f"{2 / 0.3:.2f} (capped: host network)"
    )


def test_the_measured_run_is_read_on_the_same_machine():
    """An unshaped run moved at the ceiling, so its communication is taken out of its
    compute; a shaped run above the ceiling moved at the ceiling."""
    machine = model.Machine(cores=2, bytes_per_s=1000.0)  # 8 kbit/s, to reuse _desc's bytes
    m = from_describe(_desc(), Inputs(step_s=3.0, machine=machine))
    # greedy on 2 shards: algo-2's worker moves 1000 x (1.1 + 1.0) bytes, framed, in a
    # pull and a push of a LAN's 100 us each
    assert m.profile.compute_s == pytest.approx(3.0 - 2.1 * 1514 / 1448 - 2e-4)
    assert m.profile.host_cores == 2
    assert "unshaped: this machine's" in m.sources["measured_network"]
    assert m.sources["same_machine"] == "this machine: 0.0 Gbit/s between instances, 2 cores shared"
    shaped = _desc(Tags=[{"Key": "shipyard:network", "Value": "16kbit"}])  # 2000 B/s
    capped = from_describe(shaped, Inputs(step_s=3.0, machine=machine))
    assert capped.profile.compute_s == pytest.approx(3.0 - 2.1 * 1514 / 1448)
    assert "capped at this machine's" in capped.sources["measured_network"]
    unknown = from_describe(shaped, Inputs(step_s=3.0, machine=model.Machine(2, None, "no")))
    assert unknown.profile.compute_s == pytest.approx(3.0 - 2.1 * 1514 / 1448 / 2)


def test_the_demo_s_case_capped_equals_a_link_at_the_ceiling():
    """The demo: measured at 1.25 Gbit/s, predicted at 10 Gbit/s on a machine that moves
    8 Gbit/s: the figure is the 8 Gbit/s link's, below the uncapped 10 Gbit/s one."""
    p = model.Profile("shipyard_ps", 0.04, (2.5e6, 2.5e6), placement="greedy_bytes")
    # the cap alone: a transport that costs the cores nothing
    machine = model.Machine(cores=2, bytes_per_s=8 * GBIT, ps_cpu_s_per_byte=0.0)
    ten = model.Link("ml.p2.8xlarge", 10 * GBIT, framing=model.TCP_FRAMING)
    eight = model.Link("8gbit", 8 * GBIT, framing=model.TCP_FRAMING)
    got = model.same_machine(p, ten, 2, machine)
    assert got.step_s == pytest.approx(model.predict(p, eight, 2).step_s)
    assert got.steps_per_s < model.predict(p, ten, 2).steps_per_s


def _ceiling(**over) -> ceiling.Ceiling:
    fields = {
        "key": ceiling.machine_key(),
        "gbit_per_s": 9.5,
        "cores": 2.0,
        "cores_source": "t",
        "ps_cpu_s_per_gb": 0.9,
    }
    fields.update(over)
    return ceiling.Ceiling(**fields)  # type: ignore[arg-type]


def test_the_ceiling_is_cached_per_machine_and_read_back(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ceiling, "measure", lambda: calls.append(1) or _ceiling())
    first = ceiling.get(tmp_path)
    assert calls == [1] and ceiling.cache_path(tmp_path).is_file()
    assert ceiling.get(tmp_path) == first and calls == [1]  # read from the cache
    assert ceiling.get(tmp_path, refresh=True) == first and calls == [1, 1]
    assert first.line() == (
        "same-machine ceiling: 9.5 Gbit/s between instances, 2 cores shared; "
        "shipyard.ps push/pull 0.90 CPU-s per GB"
    )
    assert first.machine() == model.Machine(2.0, 9.5e9 / 8, "", 0.9e-9)
    # another machine's file under this name, or a broken one, is measured again
    ceiling.cache_path(tmp_path).write_text(json.dumps(_ceiling(key="elsewhere").to_json()))
    assert ceiling.load(tmp_path) is None
    ceiling.cache_path(tmp_path).write_text("{not json")
    assert ceiling.load(tmp_path) is None
    ceiling.get(tmp_path)
    assert calls == [1, 1, 1]


def test_a_ceiling_measured_under_load_is_measured_again_when_quiet(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ceiling, "measure", lambda: calls.append(1) or _ceiling())
    ceiling.save(tmp_path, _ceiling(gbit_per_s=2.3, load_average=18.4))
    monkeypatch.setattr(ceiling.os, "getloadavg", lambda: (12.0, 12.0, 12.0))
    assert ceiling.get(tmp_path).gbit_per_s == 2.3 and calls == []  # still loaded: kept
    monkeypatch.setattr(ceiling.os, "getloadavg", lambda: (0.4, 3.0, 9.0))
    assert ceiling.get(tmp_path).gbit_per_s == 9.5 and calls == [1]  # quiet: measured again
    assert ceiling.get(tmp_path).gbit_per_s == 9.5 and calls == [1]  # and cached


def test_a_ceiling_measured_under_heavy_load_is_measured_again_once_the_load_halves(
    tmp_path, monkeypatch
):
    """make demo at load 2.4 capped its prediction with a ceiling measured at load 21."""
    calls = []
    monkeypatch.setattr(ceiling, "measure", lambda: calls.append(1) or _ceiling())
    ceiling.save(tmp_path, _ceiling(gbit_per_s=1.0, load_average=21.5))
    monkeypatch.setattr(ceiling.os, "getloadavg", lambda: (2.41, 2.2, 6.0))
    assert ceiling.get(tmp_path).gbit_per_s == 9.5 and calls == [1]
    # measured at load 3 on 2 cores and still at 2.5: not half, kept
    ceiling.save(tmp_path, _ceiling(gbit_per_s=4.0, load_average=3.0))
    monkeypatch.setattr(ceiling.os, "getloadavg", lambda: (2.5, 2.5, 2.5))
    assert ceiling.get(tmp_path).gbit_per_s == 4.0 and calls == [1]
    # measured on a quiet machine: kept whatever the load is now
    ceiling.save(tmp_path, _ceiling(gbit_per_s=11.0, load_average=0.5))
    monkeypatch.setattr(ceiling.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert ceiling.get(tmp_path).gbit_per_s == 11.0 and calls == [1]


def test_an_unmeasurable_ceiling_says_why():
    found = _ceiling(
        gbit_per_s=None,
        reason="iproute2's `ip` is not installed",
        ps_cpu_s_per_gb=None,
        ps_reason="a probe shard exited with 1",
    )
    assert found.line() == (
        "same-machine ceiling: unknown between instances (iproute2's `ip` is not installed), "
        "2 cores shared; shipyard.ps push/pull unknown (a probe shard exited with 1)"
    )
    assert found.machine().bytes_per_s is None
    assert found.machine().ps_cpu_s_per_byte is None
    assert found.machine().ps_why == "a probe shard exited with 1"
    assert ceiling.Ceiling.from_json(found.to_json()) == found


def test_a_cached_ceiling_without_the_transport_s_cost_is_measured_again(tmp_path, monkeypatch):
    """A file from before the transport was probed holds no ``ps_cpu_s_per_gb``: read as
    missing, so the next call measures both."""
    calls = []
    monkeypatch.setattr(ceiling, "measure", lambda: calls.append(1) or _ceiling())
    old = _ceiling().to_json()
    del old["ps_cpu_s_per_gb"]
    ceiling.cache_path(tmp_path).parent.mkdir(parents=True)
    ceiling.cache_path(tmp_path).write_text(json.dumps(old))
    assert ceiling.load(tmp_path) is None
    assert ceiling.get(tmp_path).ps_cpu_s_per_gb == 0.9 and calls == [1]


def test_cgroup_quotas_lower_the_shared_cores(tmp_path):
    root = tmp_path / "cg"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "cpu.max").write_text("max 100000\n")
    (root / "a" / "cpu.max").write_text("150000 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a/b\n")
    assert ceiling.cgroup_quota(str(proc), str(root)) == (1.5, str(root / "a" / "cpu.max"))
    cores, source = ceiling.shared_cores(str(proc), str(root))
    assert cores == min(1.5, cores) and (cores == 1.5) == ("quota of 1.5" in source)
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "job").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:memory:/job\n3:cpu,cpuacct:/job\n")
    assert ceiling.cgroup_quota(str(proc), str(v1))[0] == 0.5  # type: ignore[index]
    assert ceiling.shared_cores(str(proc), str(v1))[0] == 0.5
    proc.write_text("0::/\n")
    assert ceiling.cgroup_quota(str(proc), str(tmp_path / "none")) is None
