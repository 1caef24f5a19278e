"""Where each parameter lives: pure placement policies and the placement report.

Why three policies: TensorFlow places PS variables round-robin by creation order,
which ignores size and is the root of the classic "one PS does all the work"
complaints (tensorflow#24953, #45291); greedy-by-bytes fixes most models; a model
dominated by one huge tensor (an embedding, a big dense layer) only balances if
that tensor is sliced across shards, as BytePS/ps-lite do. ``auto`` computes all
three and keeps the best balanced, so the report can show what each would cost.

Everything here is a pure function of (tensor specs in creation order, number of
shards, chunk size): every worker computes the same placement independently, and
key ids (the numbers on the wire) are assigned in creation order, chunk by chunk,
whatever the policy.

* ``round_robin``: tensor i -> shard i % n (TensorFlow's default).
* ``greedy_bytes``: largest tensor first onto the least-loaded shard (ties: the
  earlier tensor, the lower shard).
* ``sliced``: a tensor larger than ``chunk_bytes`` is cut into fixed-size chunks
  of its flattened elements (the last one shorter); chunks and small tensors are
  then placed greedily, so the chunks of a big tensor spread over all shards.

Imbalance = max shard bytes / mean shard bytes (1.0 is perfect; n shards with
everything on one is n).
"""

from __future__ import annotations

import functools
import heapq
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import PSConfigError
from .options import AUTO, GREEDY_BYTES, POLICIES, ROUND_ROBIN, SLICED, check_policy

if TYPE_CHECKING:  # aliases are strings: job processes may run in Python 3.7/3.8
    from typing import TypeAlias

DEFAULT_CHUNK_BYTES = (
    2 << 20
)  # 2 MiB: small enough to balance and pipeline, big enough to amortize a message


def _prod(dims: tuple[int, ...]) -> int:
    """``math.prod`` of a shape (1 for ``()``): math.prod is Python 3.8+, and this module
    runs in framework environments down to Python 3.7."""
    return functools.reduce(operator.mul, dims, 1)


@dataclass(frozen=True)
class TensorSpec:
    """A parameter as placement sees it: name, shape and dtype, nothing else."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        if any(d < 0 for d in self.shape):
            raise PSConfigError(f"{self.name}: negative dimension in shape {self.shape}")

    @property
    def size(self) -> int:
        return _prod(self.shape)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @classmethod
    def of(cls, name: str, array: Any) -> TensorSpec:
        a = np.asarray(array)
        return cls(name, tuple(a.shape), a.dtype.name)


@dataclass(frozen=True)
class Chunk:
    """One server-side key: a whole tensor, or a slice of its flattened elements."""

    key_id: int
    shard: int
    offset: int  # first element, in the flattened tensor
    length: int  # number of elements
    nbytes: int
    index: int  # chunk number within its tensor
    whole: bool  # True: the whole tensor, stored with its own shape


@dataclass(frozen=True)
class KeyPlacement:
    """Where one tensor lives."""

    spec: TensorSpec
    chunks: tuple[Chunk, ...]

    @property
    def shards(self) -> list[int]:
        return sorted({c.shard for c in self.chunks})

    def chunk_shape(self, chunk: Chunk) -> tuple[int, ...]:
        return self.spec.shape if chunk.whole else (chunk.length,)


@dataclass(frozen=True)
class Placement:
    """The result of one policy."""

    policy: str
    num_shards: int
    chunk_bytes: int
    keys: tuple[KeyPlacement, ...]
    shard_bytes: tuple[int, ...]
    _by_name: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({k.spec.name: k for k in self.keys})

    @property
    def imbalance(self) -> float:
        return imbalance(self.shard_bytes)

    def __getitem__(self, name: str) -> KeyPlacement:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def chunks_on(self, shard: int) -> list[tuple[KeyPlacement, Chunk]]:
        return [(k, c) for k in self.keys for c in k.chunks if c.shard == shard]

    def to_json(self) -> list[dict[str, Any]]:
        """The ``placement`` list of the report (see stats.REPORT_SCHEMA)."""
        return [
            {
                "key": k.spec.name,
                "shape": list(k.spec.shape),
                "dtype": k.spec.dtype,
                "bytes": k.spec.nbytes,
                "shard": k.shards,
                "chunks": [
                    {
                        "id": c.key_id,
                        "shard": c.shard,
                        "offset": c.offset,
                        "length": c.length,
                        "bytes": c.nbytes,
                    }
                    for c in k.chunks
                ],
            }
            for k in self.keys
        ]


@dataclass(frozen=True)
class PlacementReport:
    """The chosen placement plus what every policy would have given."""

    requested: str
    chosen: Placement
    candidates: Mapping[str, Placement]

    @property
    def imbalances(self) -> dict[str, float]:
        return {name: round(p.imbalance, 6) for name, p in self.candidates.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.chosen.policy,
            "requested_policy": self.requested,
            "num_shards": self.chosen.num_shards,
            "chunk_bytes": self.chosen.chunk_bytes,
            "imbalance": self.imbalances,
            "shard_bytes": {name: list(p.shard_bytes) for name, p in self.candidates.items()},
            "placement": self.chosen.to_json(),
        }


def imbalance(shard_bytes: Sequence[int]) -> float:
    """max / mean of per-shard bytes; 1.0 when nothing is placed."""
    total = sum(shard_bytes)
    if not shard_bytes or total == 0:
        return 1.0
    return max(shard_bytes) / (total / len(shard_bytes))


SpecsLike: TypeAlias = "Sequence[TensorSpec] | Mapping[str, Any]"


def as_specs(params: SpecsLike | Iterable[tuple[str, Any]]) -> list[TensorSpec]:
    """TensorSpecs from specs, a name->array mapping, or (name, array) pairs (order kept)."""
    items: Iterable[Any] = params.items() if isinstance(params, Mapping) else params
    out: list[TensorSpec] = []
    seen: set[str] = set()
    for item in items:
        spec = item if isinstance(item, TensorSpec) else TensorSpec.of(item[0], item[1])
        if spec.name in seen:
            raise PSConfigError(f"parameter name {spec.name!r} appears twice")
        seen.add(spec.name)
        out.append(spec)
    return out


def _check(num_shards: int) -> None:
    if not isinstance(num_shards, int) or num_shards < 1:
        raise PSConfigError(f"num_shards must be a positive integer, got {num_shards!r}")


def _whole(
    specs: Sequence[TensorSpec], shard_of: Sequence[int], policy: str, n: int, chunk_bytes: int
) -> Placement:
    keys = []
    loads = [0] * n
    for i, (spec, shard) in enumerate(zip(specs, shard_of)):
        keys.append(KeyPlacement(spec, (Chunk(i, shard, 0, spec.size, spec.nbytes, 0, True),)))
        loads[shard] += spec.nbytes
    return Placement(policy, n, chunk_bytes, tuple(keys), tuple(loads))


def _greedy(sizes: Sequence[int], n: int) -> list[int]:
    """Largest first onto the least-loaded shard; deterministic tie-breaks."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    heap = [(0, s) for s in range(n)]
    out = [0] * len(sizes)
    for i in order:
        load, shard = heapq.heappop(heap)
        out[i] = shard
        heapq.heappush(heap, (load + sizes[i], shard))
    return out


def round_robin(
    specs: Sequence[TensorSpec], num_shards: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Placement:
    """Tensor i (creation order) -> shard i % num_shards."""
    _check(num_shards)
    return _whole(
        specs, [i % num_shards for i in range(len(specs))], ROUND_ROBIN, num_shards, chunk_bytes
    )


def greedy_bytes(
    specs: Sequence[TensorSpec], num_shards: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Placement:
    """Largest tensor first onto the least-loaded shard."""
    _check(num_shards)
    return _whole(
        specs, _greedy([s.nbytes for s in specs], num_shards), GREEDY_BYTES, num_shards, chunk_bytes
    )


def sliced(
    specs: Sequence[TensorSpec], num_shards: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Placement:
    """Split tensors above ``chunk_bytes`` into fixed-size chunks; place all pieces greedily."""
    _check(num_shards)
    if chunk_bytes < 1:
        raise PSConfigError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    pieces: list[
        tuple[int, int, int, int, bool]
    ] = []  # (tensor idx, offset, length, nbytes, whole)
    for t, spec in enumerate(specs):
        if spec.nbytes <= chunk_bytes:
            pieces.append((t, 0, spec.size, spec.nbytes, True))
            continue
        per = max(1, chunk_bytes // spec.itemsize)
        for off in range(0, spec.size, per):
            length = min(per, spec.size - off)
            pieces.append((t, off, length, length * spec.itemsize, False))
    shard_of = _greedy([p[3] for p in pieces], num_shards)
    loads = [0] * num_shards
    by_tensor: list[list[Chunk]] = [[] for _ in specs]
    for key_id, (piece, shard) in enumerate(zip(pieces, shard_of)):
        t, off, length, nbytes, whole = piece
        by_tensor[t].append(Chunk(key_id, shard, off, length, nbytes, len(by_tensor[t]), whole))
        loads[shard] += nbytes
    keys = tuple(KeyPlacement(spec, tuple(ch)) for spec, ch in zip(specs, by_tensor))
    return Placement(SLICED, num_shards, chunk_bytes, keys, tuple(loads))


_POLICY_FUNCS = {ROUND_ROBIN: round_robin, GREEDY_BYTES: greedy_bytes, SLICED: sliced}


def place(
    params: SpecsLike | Iterable[tuple[str, Any]],
    num_shards: int,
    policy: str = AUTO,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> PlacementReport:
    """Compute all three policies and choose ``policy`` (``auto``: lowest imbalance,
    ties resolved in the order round_robin, greedy_bytes, sliced: fewer messages first)."""
    check_policy(policy)
    specs = as_specs(params)
    candidates = {name: fn(specs, num_shards, chunk_bytes) for name, fn in _POLICY_FUNCS.items()}
    if policy == AUTO:
        chosen = min(
            candidates.values(), key=lambda p: (round(p.imbalance, 9), POLICIES.index(p.policy))
        )
    else:
        chosen = candidates[policy]
    return PlacementReport(policy, chosen, candidates)


def reassemble(spec: TensorSpec, parts: Mapping[int, np.ndarray], kp: KeyPlacement) -> np.ndarray:
    """Rebuild a tensor from its chunks (chunk index -> flat array). Used by tests and tools."""
    out = np.empty(spec.size, dtype=spec.dtype)
    for c in kp.chunks:
        out[c.offset : c.offset + c.length] = np.asarray(parts[c.index]).reshape(-1)
    return out.reshape(spec.shape)
