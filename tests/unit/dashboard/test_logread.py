"""Reading a job's logs a page at a time from a cursor of byte offsets, on real files."""

from __future__ import annotations

import os

import pytest

from shipyard.dashboard import logread
from shipyard.dashboard.logread import CursorError, format_cursor, parse_cursor, read_page


def _write(path, text: str) -> str:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
    return str(path)


def test_first_poll_starts_at_the_tail_and_says_how_much_came_before(tmp_path) -> None:
    line = "x" * 99 + "\n"
    path = _write(tmp_path / "algo-1.log", line * 30_000 + "last\n")  # ~3 MB
    page = read_page({"algo-1": path}, None, final=False)
    assert page.lines[-1] == ("algo-1", "last")
    assert all(text == "x" * 99 for _, text in page.lines[:-1])  # no half line at the cut
    assert sum(len(t) + 1 for _, t in page.lines) <= logread.TAIL
    assert page.skipped + sum(len(t) + 1 for _, t in page.lines) == os.path.getsize(path)
    assert page.cursor == {"algo-1": os.path.getsize(path)} and not page.more


def test_a_cursor_reads_only_what_is_new_in_bounded_pages(tmp_path) -> None:
    path = _write(tmp_path / "a.log", "".join(f"line {i}\n" for i in range(400_000)))
    size = os.path.getsize(path)
    cursor, seen, polls = {"algo-1": 0}, [], 0
    while True:
        page = read_page({"algo-1": path}, cursor, final=False)
        polls += 1
        assert sum(len(t) + 1 for _, t in page.lines) <= logread.CHUNK
        seen += [t for _, t in page.lines]
        cursor = page.cursor
        if not page.more:
            break
    assert polls >= size // logread.CHUNK > 1  # many bounded pages, not one read of all
    assert seen == [f"line {i}" for i in range(400_000)]  # every line once, in order
    _write(path, "new one\n")
    assert read_page({"algo-1": path}, cursor, final=False).lines == [("algo-1", "new one")]


def test_half_a_line_waits_for_its_end_unless_the_job_is_over(tmp_path) -> None:
    path = _write(tmp_path / "a.log", "whole\nhal")
    page = read_page({"algo-1": path}, {"algo-1": 0}, final=False)
    assert page.lines == [("algo-1", "whole")] and page.cursor == {"algo-1": 6}
    assert read_page({"algo-1": path}, page.cursor, final=False).lines == []
    _write(path, "f\n")
    assert read_page({"algo-1": path}, page.cursor, final=False).lines == [("algo-1", "half")]
    _write(path, "no newline at the end")
    done = read_page({"algo-1": path}, {"algo-1": 11}, final=True)
    assert done.lines == [("algo-1", "no newline at the end")]


def test_a_line_longer_than_a_page_still_moves_on(tmp_path) -> None:
    path = _write(tmp_path / "a.log", "y" * (logread.CHUNK + 10) + "\nafter\n")
    first = read_page({"algo-1": path}, {"algo-1": 0}, final=False)
    assert first.more and first.cursor == {"algo-1": logread.CHUNK}
    rest = read_page({"algo-1": path}, first.cursor, final=False)
    assert rest.lines == [("algo-1", "y" * 10), ("algo-1", "after")]


def test_rank_lines_keep_their_label_and_new_files_start_at_zero(tmp_path) -> None:
    one = _write(tmp_path / "1.log", "[algo-2 rank 3] hello\n")
    two = _write(tmp_path / "2.log", "from two\n")
    page = read_page({"algo-1": one, "algo-2": two}, {"algo-1": 0}, final=False)
    assert page.lines == [("algo-2 rank 3", "hello"), ("algo-2", "from two")]
    assert page.cursor == {"algo-1": 22, "algo-2": 9}


def test_a_replaced_shorter_file_is_read_from_its_start(tmp_path) -> None:
    path = _write(tmp_path / "a.log", "short\n")
    assert read_page({"algo-1": path}, {"algo-1": 10_000}, final=False).lines == [
        ("algo-1", "short")
    ]


def test_cursor_round_trip_and_clear_errors() -> None:
    cursor = {"algo-1": 12, "algo-2#2": 0}
    assert parse_cursor(format_cursor(cursor)) == cursor
    assert parse_cursor("") == {}
    for bad in ("algo-1", "algo-1:-3", "../etc:1", "algo-1:1e9", "algo-1:" + "9" * 30):
        with pytest.raises(CursorError, match="HOST:OFFSET"):
            parse_cursor(bad)
