"""PipeModeDataset: a Pipe-mode channel as a tf.data dataset (sagemaker_tensorflow's API).

``PipeModeDataset(channel, record_format='RecordIO'|'TFRecord'|'TextLine', state_dir,
pipe_dir, config_dir, benchmark, ...)`` is a ``tf.data.Dataset`` of scalar strings. As
in SageMaker, every iterator made from it (each ``for`` loop, each Keras epoch, each
round of ``.repeat()``) reads the channel's next epoch FIFO, and the epoch index lives
in ``<state_dir>/.<channel>-pipe_mode-state``.

TensorFlow's own file readers use pread(), which a FIFO does not support, so the bytes
are split into records in Python and handed to TensorFlow a batch at a time (a
generator yielding string vectors, then ``unbatch``): the per-record cost stays in C++.
"""

from __future__ import annotations

import time

import tensorflow as tf

from shipyard.data.pipe import EpochReader, PipeModeDatasetException

__all__ = ["PipeModeDataset", "PipeModeDatasetException"]


def _make(
    channel: str,
    record_format: str = "RecordIO",
    state_dir: str | None = None,
    pipe_dir: str | None = None,
    config_dir: str | None = None,
    benchmark: bool = False,
    benchmark_records_interval: int = 0,
    max_corrupted_records_to_skip: int = 0,
):
    if max_corrupted_records_to_skip:
        raise PipeModeDatasetException(
            "max_corrupted_records_to_skip is not supported: a "
            "corrupt record stops the epoch with an error"
        )
    reader = EpochReader(channel, record_format, state_dir, pipe_dir, config_dir)

    def batches():
        started, count, nbytes = time.monotonic(), 0, 0
        for batch in reader.batches():
            if benchmark:
                count += len(batch)
                nbytes += sum(map(len, batch))
                if benchmark_records_interval and count % benchmark_records_interval < len(batch):
                    _report(channel, count, nbytes, started)
            yield batch
        if benchmark:
            _report(channel, count, nbytes, started)

    try:
        ds = tf.data.Dataset.from_generator(
            batches, output_signature=tf.TensorSpec(shape=(None,), dtype=tf.string)
        )
    except TypeError:  # TensorFlow before 2.4 (1.13 of the py37 tutorials): no output_signature
        ds = tf.data.Dataset.from_generator(
            batches, output_types=tf.string, output_shapes=tf.TensorShape([None])
        )
    if not hasattr(ds, "unbatch"):  # TensorFlow 1.x before 1.15
        return ds.apply(tf.data.experimental.unbatch())
    return ds.unbatch()


def _report(channel: str, count: int, nbytes: int, started: float) -> None:
    elapsed = max(time.monotonic() - started, 1e-9)
    print(
        f"PipeModeDataset {channel}: {count} records, {nbytes / 1e6:.1f} MB, "
        f"{nbytes / 1e6 / elapsed:.1f} MB/s",
        flush=True,
    )


class _Meta(type):
    def __instancecheck__(cls, obj) -> bool:  # isinstance(ds, PipeModeDataset)
        return isinstance(obj, tf.data.Dataset) and getattr(obj, "_shipyard_pipe", False)


class PipeModeDataset(metaclass=_Meta):
    """Calling it returns the tf.data dataset (``isinstance(ds, tf.data.Dataset)``)."""

    def __new__(cls, channel: str, record_format: str = "RecordIO", **kwargs):
        ds = _make(channel, record_format, **kwargs)
        ds._shipyard_pipe = True
        return ds
