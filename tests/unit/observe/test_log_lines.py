"""Log lines: MPI ranks under their own host and rank; framework noise hidden, never the user's."""

from __future__ import annotations

import io

from shipyard.observe.logs import LogTailer, attribute, is_noise, print_lines, select


def test_rank_lines_move_to_their_own_host(tmp_path):
    log = tmp_path / "algo-1.log"
    log.write_text(
        "[shipyard-agent] algo-1: starting mpirun\n"
        "[algo-1 rank 0] step 1\n"
        "[algo-2 rank 3] step 1 loss=0.5\n"
        "[algo-2 rank 2] Traceback (most recent call last):\n"
    )
    lines = LogTailer({"algo-1": str(log)}).poll(flush=True)
    assert lines[1:] == [
        ("algo-1 rank 0", "step 1"),
        ("algo-2 rank 3", "step 1 loss=0.5"),
        ("algo-2 rank 2", "Traceback (most recent call last):"),
    ]
    out = io.StringIO()
    print_lines(select(lines, "algo-2"), out)
    assert out.getvalue() == (
        "[algo-2 rank 3] step 1 loss=0.5\n[algo-2 rank 2] Traceback (most recent call last):\n"
    )
    assert [lb for lb, _ in select(lines, "algo-1")] == ["algo-1", "algo-1 rank 0"]


def test_retried_attempt_labels_select_by_host():
    assert select([("algo-2#2", "x"), ("algo-1#2", "y")], "algo-2") == [("algo-2#2", "x")]


def test_a_user_line_that_looks_like_a_tag_elsewhere_is_kept():
    assert attribute("algo-1", "note: [algo-2 rank 3] is mine") == (
        "algo-1",
        "note: [algo-2 rank 3] is mine",
    )


NOISE = [
    "2026-11-25 11:50:01.123456: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results",
    "2026-11-25 11:50:01.200000: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:152] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "I0000 00:00:1732535401.123456   12345 device_compiler.h:188] Compiled cluster using XLA!",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.",
    "algo-1:123:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
]
USER = [
    "epoch 1 loss=0.25",
    "I think NCCL is great",
    "Traceback (most recent call last):",
    "ValueError: failed to load",
    "2026-11-25 11:50:01,000 INFO my own logger line",
    "W tensorflow is mentioned by the user",
]


def test_noise_is_hidden_and_user_output_kept():
    assert all(is_noise(n) for n in NOISE), [n for n in NOISE if not is_noise(n)]
    assert not any(is_noise(u) for u in USER), [u for u in USER if is_noise(u)]
    out = io.StringIO()
    hidden = print_lines([("algo-1", ln) for ln in NOISE + USER], out, show_noise=False)
    assert hidden == len(NOISE)
    assert out.getvalue().splitlines() == [f"[algo-1] {u}" for u in USER]
    out = io.StringIO()
    assert print_lines([("algo-1", ln) for ln in NOISE], out, show_noise=True) == 0
    assert len(out.getvalue().splitlines()) == len(NOISE)
