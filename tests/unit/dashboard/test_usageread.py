"""Reading a job's utilization samples a page at a time from a byte cursor, on real
files written as the sampler writes them (``observe.utilization.Sampler``)."""

from __future__ import annotations

import json
import os

import pytest

from shipyard.dashboard import usageread
from shipyard.dashboard.logread import CursorError
from shipyard.observe.utilization import Instance, Sampler


def _sample(host: str, at: float, **metrics: float) -> str:
    return json.dumps({"Timestamp": at, "Host": host, "Attempt": 1, **metrics}) + "\n"


def test_real_sampler_output_is_read_whole_then_only_what_is_new(tmp_path) -> None:
    sampler = Sampler(str(tmp_path), machine_memory=1 << 30, gpus=dict)
    me = os.getpid()
    sampler.start([Instance("algo-1", me, str(tmp_path)), Instance("algo-2", me, str(tmp_path))], 1)
    sampler.sample({"algo-1", "algo-2"})
    path = usageread.path(str(tmp_path))
    first = usageread.read_page(path, 0)
    assert [s["Host"] for s in first.samples] == ["algo-1", "algo-2"]
    assert all(s["MemoryBytes"] > 0 and "DiskUtilization" in s for s in first.samples)
    assert first.cursor == os.path.getsize(path) and not first.more
    assert usageread.read_page(path, first.cursor).samples == []  # nothing new
    sampler.sample({"algo-2"})  # algo-1 has ended
    later = usageread.read_page(path, first.cursor)
    assert [s["Host"] for s in later.samples] == ["algo-2"]
    assert later.cursor == os.path.getsize(path)


def test_a_long_file_comes_in_bounded_pages_each_sample_once(tmp_path) -> None:
    path = tmp_path / usageread.UTILIZATION_NAME
    path.write_text("".join(_sample(f"algo-{i % 4 + 1}", i, CPUUtilization=i) for i in range(9000)))
    cursor, seen, pages = 0, [], 0
    while True:
        page = usageread.read_page(str(path), cursor)
        assert cursor < page.cursor <= cursor + usageread.CHUNK
        seen += [s["CPUUtilization"] for s in page.samples]
        cursor, pages = page.cursor, pages + 1
        if not page.more:
            break
    assert pages > 1 and seen == list(range(9000))


def test_half_a_line_waits_and_a_cut_line_is_passed_over(tmp_path) -> None:
    path = tmp_path / usageread.UTILIZATION_NAME
    whole = _sample("algo-1", 1.0, CPUUtilization=5)
    path.write_text(whole + '{"Timestamp": 2, "Host": "alg')  # the sampler mid-write
    page = usageread.read_page(str(path), 0)
    assert len(page.samples) == 1 and page.cursor == len(whole)
    with open(path, "a") as fh:
        fh.write('o-1", "CPUUtilization": 6}\n')
        fh.write("{cut by a killed supervisor\n")
        fh.write(_sample("algo-1", 3.0, CPUUtilization=7))
    later = usageread.read_page(str(path), page.cursor)
    assert [s["CPUUtilization"] for s in later.samples] == [6, 7]


def test_only_sample_fields_leave_and_a_replaced_file_is_read_from_its_start(tmp_path) -> None:
    path = tmp_path / usageread.UTILIZATION_NAME
    path.write_text(json.dumps({"Timestamp": 1, "Host": "algo-1", "Other": "x"}) + "\n[1, 2]\n")
    assert usageread.read_page(str(path), 0).samples == [{"Timestamp": 1, "Host": "algo-1"}]
    assert usageread.read_page(str(path), 10_000).cursor == os.path.getsize(path)
    missing = usageread.read_page(str(tmp_path / "none.jsonl"), 0)
    assert missing.samples == [] and missing.cursor == 0 and not missing.more


@pytest.mark.parametrize("text", ["", "-1", "12a", "1,2", "9" * 19, "algo-1:5"])
def test_a_cursor_is_a_byte_offset_or_a_clear_error(text: str) -> None:
    with pytest.raises(CursorError, match="not a byte offset .* pass the 'cursor'"):
        usageread.parse_cursor(text)
    assert usageread.parse_cursor("1234") == 1234
