"""CIFAR-10-shaped TFRecords in the tutorials' format, generated (nothing downloads).

Each record is a tf.train.Example with ``image`` (32x32x3 uint8, raw bytes) and
``label`` (int64), like the SageMaker tutorial's generate_cifar10_tfrecords.py. The
images are synthetic but learnable: each class has its own colour and stripe pattern
plus noise, so a CNN's accuracy shows whether the data reached it intact.

    python examples/data/make_cifar_tfrecords.py OUT_DIR [--train 2000] [--eval 500]
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    base = np.random.default_rng(1234).integers(40, 216, size=(10, 3))
    x = np.arange(32)
    out = np.empty((n, 32, 32, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        stripes = ((x[:, None] * (label + 1) + x[None, :] * (label % 3)) % 8 < 4) * 40
        img = base[label][None, None, :] + stripes[..., None] + rng.normal(0, 25, (32, 32, 3))
        out[i] = np.clip(img, 0, 255)
    return out, labels


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(image: bytes, label: int) -> bytes:
    """``tf.train.Example`` with ``image`` (a BytesList) and ``label`` (an Int64List),
    serialized by hand: Example.features (1) -> Features.feature (1, a map: key 1, value 2)
    -> Feature.bytes_list (1) / int64_list (3) -> value (1, packed for int64). What
    ``tf.train.Example(...).SerializeToString()`` gives, without importing TensorFlow
    (7-10 s of CPU) in a process that only writes the data."""
    feature = {
        b"image": _field(1, _field(1, image)),
        b"label": _field(3, _field(1, _varint(label))),
    }
    entries = b"".join(_field(1, _field(1, k) + _field(2, v)) for k, v in feature.items())
    return _field(1, entries)


def write(path: str, n: int, seed: int, shards: int = 1) -> list[str]:
    from shipyard.data.tfrecord import encode  # TFRecord framing, stdlib only

    x, y = images(n, seed)
    paths = []
    for s in range(shards):
        shard_path = path if shards == 1 else f"{path}-{s:02d}"
        with open(shard_path, "wb") as fh:
            for i in range(s, n, shards):
                fh.write(encode(example(x[i].tobytes(), int(y[i]))))
        paths.append(shard_path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--eval", type=int, default=500)
    args = parser.parse_args()
    for split, n, seed in (("train", args.train, 1), ("eval", args.eval, 2)):
        os.makedirs(os.path.join(args.out, split), exist_ok=True)
        write(os.path.join(args.out, split, f"{split}.tfrecords"), n, seed)
    print(f"wrote {args.train} train and {args.eval} eval records under {args.out}")


if __name__ == "__main__":
    main()
