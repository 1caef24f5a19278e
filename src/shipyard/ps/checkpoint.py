"""Atomic shard checkpoints: parameters + optimizer state + step counters.

Why this format: a parameter-server job that loses a shard must resume exactly
where it was (Adam moments and step counts included), the files must be safe to
load (no pickle: ``np.load(allow_pickle=False)``), and a crash mid-write must
never leave a checkpoint that half-loads.

Layout, in the instance's checkpoints directory (``/opt/ml/checkpoints``-style,
passed with ``--checkpoint-dir``)::

    ps-shard-000.json              the manifest: the commit point
    ps-shard-000.00000007.npz      arrays of generation 7 (one file per generation)

A save writes the new ``.npz`` under a temporary name, fsyncs it and renames it
into place, then writes the manifest the same way (temp + fsync + ``os.replace``)
and fsyncs the directory; only then are older generations deleted. A reader
follows the manifest, so it sees the old generation or the new one, never a mix.
The manifest records the SHA-256 of the data file, checked on load.

Manifest (JSON)::

    {"format": "shipyard.ps.checkpoint/v1", "shard": 0, "num_shards": 2,
     "generation": 7, "updates": 1200, "global_step": 600, "time": 1700000000.0,
     "data": "ps-shard-000.00000007.npz", "data_sha256": "...",
     "optimizers": {"default": {"name": "adam", "lr": 0.001, ...}},
     "workers": {"0": 600, "1": 598},            # progress (steps) per worker id
     "keys": [{"id": 0, "name": "fc.weight", "chunk": 0, "offset": 0,
               "shape": [10, 64], "dtype": "float32", "group": "default",
               "version": 600, "initialized": true,
               "scalars": {"step": 600}, "arrays": ["exp_avg", "exp_avg_sq"]}]}

Arrays in the ``.npz``: ``p<id>`` (value), ``s<id>.<state name>`` (optimizer state).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .consistency import WorkerTable
from .errors import CheckpointError
from .optimizers import make_optimizer, state_arrays, state_scalars
from .shard import Shard, Slot

FORMAT = "shipyard.ps.checkpoint/v1"


def manifest_path(directory: str | Path, index: int) -> Path:
    return Path(directory) / f"ps-shard-{index:03d}.json"


def _data_name(index: int, generation: int) -> str:
    return f"ps-shard-{index:03d}.{generation:08d}.npz"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(8 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def save(shard: Shard, workers: WorkerTable, directory: str | Path) -> Path:
    """Write a new generation for ``shard`` atomically; returns the manifest path."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        mpath = manifest_path(d, shard.index)
        generation = 1
        if mpath.exists():
            try:
                generation = int(json.loads(mpath.read_text())["generation"]) + 1
            except (ValueError, KeyError, OSError):
                generation = int(time.time())
        arrays: dict[str, np.ndarray] = {}
        keys: list[dict[str, Any]] = []
        for slot in sorted(shard.slots.values(), key=lambda s: s.key_id):
            entry = slot.spec_json()
            entry.update(
                {
                    "version": slot.version,
                    "initialized": slot.initialized,
                    "scalars": state_scalars(slot.state),
                    "arrays": sorted(state_arrays(slot.state)),
                }
            )
            if slot.value is not None:
                arrays[f"p{slot.key_id}"] = slot.value
            for name, arr in state_arrays(slot.state).items():
                arrays[f"s{slot.key_id}.{name}"] = arr
            keys.append(entry)
        data_name = _data_name(shard.index, generation)
        tmp = d / f".{data_name}.tmp"
        with open(tmp, "wb") as f:
            # numpy's stub: a **dict[str, ndarray] might hold allow_pickle (a bool)
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / data_name)
        manifest = {
            "format": FORMAT,
            "shard": shard.index,
            "num_shards": shard.num_shards,
            "generation": generation,
            "updates": shard.updates,
            "global_step": shard.global_step,
            "time": time.time(),
            "data": data_name,
            "data_sha256": _sha256_file(d / data_name),
            "optimizers": {g: o.config() for g, o in shard.optimizers.items()},
            "workers": {str(w): st.progress for w, st in sorted(workers.workers.items())},
            "keys": keys,
        }
        mtmp = d / f".{mpath.name}.tmp"
        with open(mtmp, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(mtmp, mpath)
        _fsync_dir(d)
        for old in glob.glob(str(d / f"ps-shard-{shard.index:03d}.*.npz")):
            if Path(old).name != data_name:
                try:
                    os.remove(old)
                except OSError:
                    pass
        shard.dirty = False
        return mpath
    except OSError as exc:
        raise CheckpointError(
            f"cannot write checkpoint of shard {shard.index} to {d}: {exc}"
        ) from exc


@dataclass
class Loaded:
    """A checkpoint read back: the manifest and its arrays."""

    manifest: dict[str, Any]
    arrays: dict[str, np.ndarray]


def load(directory: str | Path, index: int, num_shards: int) -> Loaded | None:
    """Read shard ``index``'s latest checkpoint, or None if there is none.

    CheckpointError if it exists but is unreadable, corrupt, or was written for a
    different number of shards (the placement would not match).
    """
    mpath = manifest_path(directory, index)
    if not mpath.exists():
        return None
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"unreadable checkpoint manifest {mpath}: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mpath}: unknown format {manifest.get('format')!r}")
    if manifest.get("shard") != index or manifest.get("num_shards") != num_shards:
        raise CheckpointError(
            f"{mpath} was written by shard {manifest.get('shard')} of {manifest.get('num_shards')}, "
            f"this is shard {index} of {num_shards}: resume with the same number of shards "
            "(or start from an empty checkpoint directory)"
        )
    data = Path(directory) / manifest["data"]
    try:
        digest = _sha256_file(data)
    except OSError as exc:
        raise CheckpointError(f"checkpoint data {data} missing: {exc}") from exc
    if digest != manifest.get("data_sha256"):
        raise CheckpointError(f"checkpoint data {data} does not match its manifest checksum")
    try:
        with np.load(data, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {data}: {exc}") from exc
    return Loaded(manifest, arrays)


def restore(shard: Shard, workers: WorkerTable, loaded: Loaded) -> None:
    """Put a loaded checkpoint into an empty shard and worker table."""
    m = loaded.manifest
    try:
        for group, cfg in m.get("optimizers", {}).items():
            shard.optimizers[group] = make_optimizer(cfg)
        for entry in m["keys"]:
            dtype = np.dtype(entry["dtype"])
            slot = Slot(
                int(entry["id"]),
                entry["name"],
                int(entry["chunk"]),
                int(entry["offset"]),
                tuple(entry["shape"]),
                dtype,
                group=entry.get("group", "default"),
                version=int(entry["version"]),
            )
            if entry.get("initialized"):
                slot.value = np.array(loaded.arrays[f"p{slot.key_id}"], dtype=dtype).reshape(
                    slot.shape
                )
                slot.state = dict(entry.get("scalars", {}))
                for name in entry.get("arrays", []):
                    slot.state[name] = np.array(loaded.arrays[f"s{slot.key_id}.{name}"])
            shard.slots[slot.key_id] = slot
            shard.by_name[(slot.name, slot.chunk)] = slot.key_id
        shard.updates = int(m.get("updates", 0))
        workers.restore({int(w): int(p) for w, p in m.get("workers", {}).items()})
        shard.dirty = False
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint of shard {shard.index} is inconsistent: {exc}") from exc
