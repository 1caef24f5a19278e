"""Write scikit-learn's digits (1797 real 8x8 images, shipped with the package) as a channel.

    python examples/data/make_digits.py OUT_DIR

writes OUT_DIR/train.npz and OUT_DIR/test.npz (x: float32 in [0, 1], shape (n, 8, 8, 1);
y: int64 labels), split 80/20 with a fixed seed. No download: the data ships with sklearn.
"""

from __future__ import annotations

import os
import sys

import numpy as np


def write_digits(out_dir: str, seed: int = 0) -> tuple[str, str]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    cut = int(0.8 * len(y))
    os.makedirs(out_dir, exist_ok=True)
    train, test = os.path.join(out_dir, "train.npz"), os.path.join(out_dir, "test.npz")
    np.savez(train, x=x[:cut], y=y[:cut])
    np.savez(test, x=x[cut:], y=y[cut:])
    return train, test


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print("\n".join(write_digits(sys.argv[1])))
