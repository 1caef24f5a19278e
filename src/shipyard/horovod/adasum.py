"""Adasum (Maleki et al., 2020), the combination rule Horovod offers as ``op=hvd.Adasum``.

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

applied pairwise up a binary tree over the ranks (rank 2i with 2i+1, then pairs of pairs),
per tensor (``segments``), in float64. This implementation gathers every rank's vector and
combines locally: simple and exactly the same result on every rank, but it moves
``size x`` the data of a ring; fine for the optional op it is. Works for any number of
ranks (an odd one out at a level is carried up unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _pair(a: np.ndarray, b: np.ndarray, segments: Sequence[tuple[int, int]]) -> np.ndarray:
    out = np.empty_like(a)
    for start, stop in segments:
        x, y = a[start:stop], b[start:stop]
        dot = float(np.dot(x, y))
        nx, ny = float(np.dot(x, x)), float(np.dot(y, y))
        ca = 1.0 - dot / (2.0 * nx) if nx > 0 else 1.0
        cb = 1.0 - dot / (2.0 * ny) if ny > 0 else 1.0
        out[start:stop] = ca * x + cb * y
    return out


def adasum_combine(
    vectors: Sequence[np.ndarray], segments: Sequence[tuple[int, int]] | None = None
) -> np.ndarray:
    """Combine one flat vector per rank (rank order). Returns float64."""
    level = [np.asarray(v, dtype=np.float64).reshape(-1) for v in vectors]
    if segments is None:
        segments = [(0, level[0].size)]
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            nxt.append(_pair(level[i], level[i + 1], segments))
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]
