"""``shipyard doctor``'s same-machine ceiling (issue 39): measured for real between two
instances' network namespaces (or this machine's loopback where it has no sandbox), shown
as one line, cached in the home and read back by the next call; ``--measure`` measures
again. Whether a call measured is read from the cache file, never from how long it took."""

from __future__ import annotations

import json
import re

import psutil

from shipyard.planner import ceiling
from tests.integration.test_cli import cli

LINE = re.compile(
    r"^same-machine ceiling: (\d+(?:\.\d+)?) Gbit/s between instances, (\d+(?:\.\d+)?) cores "
    r"shared; shipyard.ps push/pull (\d+\.\d\d) CPU-s per GB$",
    re.M,
)


def _cached(home) -> dict:
    return json.loads(ceiling.cache_path(home).read_text())


def test_doctor_shows_the_ceiling_and_caches_it(home):
    assert not ceiling.cache_path(home).exists()
    first = cli("doctor")
    assert first.returncode == 0, first.stderr
    match = LINE.search(first.stdout)
    assert match, first.stdout[-2000:]
    assert float(match.group(1)) > 0 and float(match.group(2)) >= 1 and float(match.group(3)) > 0
    assert "measured now in" in first.stdout
    cached = _cached(home)
    assert f"{cached['gbit_per_s']:.1f}" == match.group(1)
    assert f"{cached['ps_cpu_s_per_gb']:.2f}" == match.group(3)
    assert len(cached["directions"]) == 2 and cached["key"] == ceiling.machine_key()
    assert cached["path"] in (
        "veth pairs on a bridge between two network namespaces (the instances' job network)",
        "this machine's loopback (no instance sandbox here: instances share its network)",
    )
    # the second call reads the cache: the file is the one the first call wrote
    second = cli("doctor")
    assert second.returncode == 0, second.stderr
    assert LINE.search(second.stdout).group(0) == match.group(0)  # type: ignore[union-attr]
    assert "cached (measured" in second.stdout
    assert _cached(home) == cached
    # --measure measures again: a new measurement is written
    third = cli("doctor", "--measure")
    assert third.returncode == 0, third.stderr
    assert LINE.search(third.stdout) and "measured now in" in third.stdout
    assert _cached(home)["measured_at"] > cached["measured_at"]


def test_the_probes_leave_no_process_behind():
    before = {p.pid for p in psutil.process_iter()}
    found = ceiling.measure(0.1, 0.3)
    assert found.gbit_per_s is not None and found.gbit_per_s > 0, found.reason
    # shipyard.ps between two instances: some CPU per byte (tens of ms per GB at least,
    # below a minute: a hang guard on the figure, not a benchmark)
    assert found.ps_cpu_s_per_gb is not None, found.ps_reason
    assert 0.01 < found.ps_cpu_s_per_gb < 60
    assert found.ps_gbyte_per_s is not None and found.ps_gbyte_per_s > 0
    assert found.seconds < 60  # a generous hang guard, not a timing assertion
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before
        and any(
            mark in " ".join(p.info.get("cmdline") or [])
            for mark in ("shipyard.planner.ceiling_probe", "transport_probe", "shipyard-ps-probe-")
        )
    ]
    assert left == []
