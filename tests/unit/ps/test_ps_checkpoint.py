"""Checkpoint files: atomic generations, integrity checks, refusal of a mismatched resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shipyard.ps import checkpoint as ckpt
from shipyard.ps.consistency import WorkerTable
from shipyard.ps.errors import CheckpointError
from shipyard.ps.optimizers import SCRATCH_SLOTS
from shipyard.ps.shard import Shard


def trained_shard(index=0, num_shards=2):
    s = Shard(index, num_shards)
    s.register(
        [
            {"id": 3, "name": "w", "shape": [2, 3], "dtype": "float32"},
            {"id": 5, "name": "emb", "chunk": 1, "offset": 100, "shape": [4], "dtype": "float64"},
            {"id": 6, "name": "later", "shape": [2], "dtype": "float32"},
        ],
        {"name": "adam", "lr": 0.1},
    )
    s.init(s.slots[3], np.arange(6, dtype=np.float32).reshape(2, 3))
    s.init(s.slots[5], np.ones(4))
    for _ in range(3):
        s.apply(s.slots[3], np.ones((2, 3), np.float32))
    s.apply(s.slots[5], np.full(4, 0.5))
    w = WorkerTable()
    w.seen(0, 0.0)
    w.advance(0, 2)
    return s, w


def test_round_trip_restores_everything(tmp_path):
    s, w = trained_shard()
    path = ckpt.save(s, w, tmp_path)
    assert path.name == "ps-shard-000.json" and not s.dirty
    manifest = json.loads(path.read_text())
    assert (
        manifest["format"] == ckpt.FORMAT
        and manifest["updates"] == 4
        and manifest["workers"] == {"0": 3}
    )
    s2, w2 = Shard(0, 2), WorkerTable()
    ckpt.restore(s2, w2, ckpt.load(tmp_path, 0, 2))
    for kid in (3, 5):
        a, b = s.slots[kid], s2.slots[kid]
        assert np.array_equal(a.value, b.value) and a.value.dtype == b.value.dtype
        assert a.version == b.version and a.state["step"] == b.state["step"]
        assert np.array_equal(a.state["exp_avg_sq"], b.state["exp_avg_sq"])
    assert not s2.slots[6].initialized  # registered, never initialized: still waiting for init
    assert s2.slots[5].offset == 100 and s2.slots[5].chunk == 1
    assert s2.optimizers["default"].config() == s.optimizers["default"].config()
    assert w2.workers[0].progress == 3 and not w2.is_live(0)
    assert s2.updates == 4
    # the restored state keeps training identically
    g = np.full((2, 3), 0.25, np.float32)
    scratch = [np.empty((2, 3), np.float32) for _ in range(SCRATCH_SLOTS)]
    s.optimizers["default"].update(s.slots[3].value, g, s.slots[3].state, lambda i: scratch[i])
    s2.apply(s2.slots[3], g)
    assert np.array_equal(s.slots[3].value, s2.slots[3].value)


def test_generations_replace_each_other_atomically(tmp_path):
    s, w = trained_shard()
    ckpt.save(s, w, tmp_path)
    s.apply(s.slots[3], np.ones((2, 3), np.float32))
    ckpt.save(s, w, tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        "ps-shard-000.00000002.npz",
        "ps-shard-000.json",
    ]  # no temp files, old gen gone
    assert ckpt.load(tmp_path, 0, 2).manifest["generation"] == 2


def test_no_pickle_in_data_file(tmp_path):
    s, w = trained_shard()
    ckpt.save(s, w, tmp_path)
    data = next(tmp_path.glob("*.npz"))
    with np.load(data, allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def test_missing_checkpoint_is_none(tmp_path):
    assert ckpt.load(tmp_path, 0, 2) is None


def test_corrupt_or_mismatched_checkpoints_are_refused(tmp_path):
    s, w = trained_shard()
    ckpt.save(s, w, tmp_path)
    with pytest.raises(CheckpointError, match="shard 0 of 2, this is shard 0 of 3"):
        ckpt.load(tmp_path, 0, 3)
    data = next(tmp_path.glob("*.npz"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum"):
        ckpt.load(tmp_path, 0, 2)
    (tmp_path / "ps-shard-000.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        ckpt.load(tmp_path, 0, 2)


def test_unwritable_directory_is_a_checkpoint_error(tmp_path):
    s, w = trained_shard()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="cannot write"):
        ckpt.save(s, w, blocker / "sub")
