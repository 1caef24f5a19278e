"""Pipe-mode channels from the script's side, framework-free.

The platform (shipyard's feeder) writes each epoch of a Pipe channel into a FIFO
``<pipe_dir>/<channel>_<epoch>``. A reader must open epoch 0, read it to the end, then
epoch 1, and so on. Like SageMaker's PipeModeDataset, the epoch to open next is kept in
``<state_dir>/.<channel>-pipe_mode-state`` (under a lock file beside it): every new
iteration over a dataset takes the next epoch, also across processes and restarts of
the reading code within one job.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator

from shipyard import settings
from shipyard.data import recordio, tfrecord
from shipyard.errors import ShipyardError

RECORD_FORMATS = ("TFRecord", "RecordIO", "TextLine")
_BASE_DEFAULT = "/opt/ml"


class PipeModeDatasetException(ShipyardError):
    """A Pipe channel cannot be read (named like sagemaker_tensorflow's exception)."""


def _base() -> str:
    return os.environ.get("SAGEMAKER_BASE_DIR") or _BASE_DEFAULT


def default_dirs() -> tuple[str, str, str]:
    """(pipe_dir, state_dir, config_dir) of this instance."""
    base = _base()
    input_dir = os.environ.get("SM_INPUT_DIR") or os.path.join(base, "input")
    config_dir = os.environ.get("SM_INPUT_CONFIG_DIR") or os.path.join(input_dir, "config")
    return os.path.join(input_dir, "data"), os.path.join(base, "pipe_state"), config_dir


def check_channel(channel: str, config_dir: str) -> dict:
    """The channel's inputdataconfig.json entry; it must exist and be in Pipe mode."""
    path = os.path.join(config_dir, "inputdataconfig.json")
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except OSError as exc:
        raise PipeModeDatasetException(
            f"cannot read {path} ({exc.strerror}): PipeModeDataset runs inside a training job"
        ) from None
    if channel not in config:
        raise PipeModeDatasetException(
            f"channel {channel!r} is not an input of this job (channels: {sorted(config)}); "
            "pass the name used in fit(inputs={...})"
        )
    mode = str(config[channel].get("TrainingInputMode", "File"))
    if mode.lower() != "pipe":
        raise PipeModeDatasetException(
            f"channel {channel!r} is in {mode} mode, not Pipe: read its files from "
            f"SM_CHANNEL_{channel.upper()}, or give it TrainingInput(..., input_mode='Pipe')"
        )
    return config[channel]


def next_epoch(channel: str, state_dir: str) -> int:
    """The epoch to read now; the state file then points at the one after it."""
    os.makedirs(state_dir, exist_ok=True)
    state = os.path.join(state_dir, f".{channel}-pipe_mode-state")
    with open(os.path.join(state_dir, f".{channel}-pipe_mode-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(state, encoding="utf-8") as fh:
                epoch = int(fh.read().strip() or 0)
        except FileNotFoundError:
            epoch = 0
        tmp = state + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(str(epoch + 1))
        os.replace(tmp, state)
    return epoch


def open_epoch(channel: str, epoch: int, pipe_dir: str, timeout: float | None = None):
    """Open the FIFO of ``epoch`` for reading, waiting for the feeder to create it."""
    path = os.path.join(pipe_dir, f"{channel}_{epoch}")
    timeout = settings.number("SHIPYARD_PIPE_WAIT_SECONDS") if timeout is None else timeout
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise PipeModeDatasetException(
                f"{path} did not appear within {timeout:.0f}s: is {channel!r} a Pipe channel "
                "of this job, and was the previous epoch read to its end?"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    return open(path, "rb", buffering=0)


def splitter(record_format: str):
    if record_format == "TFRecord":
        return tfrecord.Splitter()
    if record_format == "RecordIO":
        return recordio.Splitter()
    if record_format == "TextLine":
        return _LineSplitter()
    raise PipeModeDatasetException(
        f"record_format {record_format!r} is not one of {', '.join(RECORD_FORMATS)}"
    )


class _LineSplitter:
    def __init__(self) -> None:
        self.rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        return lines

    def close(self) -> list[bytes]:
        rest, self.rest = self.rest, b""
        return [rest] if rest else []


def iter_batches(stream, record_format: str, chunk: int = 1 << 20) -> Iterator[list[bytes]]:
    """Lists of whole records from ``stream`` (one list per chunk read)."""
    split = splitter(record_format)
    while True:
        data = stream.read(chunk)
        if not data:
            tail = split.close()
            if tail:
                yield tail
            return
        records = split.feed(data)
        if records:
            yield records


class EpochReader:
    """What both dataset wrappers share: resolve dirs, check the channel, and each call
    to ``batches()`` read the next epoch's FIFO to its end."""

    def __init__(
        self,
        channel: str,
        record_format: str = "RecordIO",
        state_dir: str | None = None,
        pipe_dir: str | None = None,
        config_dir: str | None = None,
        on_open: Callable[[int], None] | None = None,
    ) -> None:
        if record_format not in RECORD_FORMATS:
            raise PipeModeDatasetException(
                f"record_format {record_format!r} is not one of {', '.join(RECORD_FORMATS)}"
            )
        d_pipe, d_state, d_config = default_dirs()
        self.channel = channel
        self.record_format = record_format
        self.pipe_dir = pipe_dir or d_pipe
        self.state_dir = state_dir or d_state
        self.config_dir = config_dir or d_config
        self.on_open = on_open
        check_channel(channel, self.config_dir)

    def batches(self) -> Iterator[list[bytes]]:
        epoch = next_epoch(self.channel, self.state_dir)
        if self.on_open is not None:
            self.on_open(epoch)
        with open_epoch(self.channel, epoch, self.pipe_dir) as stream:
            try:
                yield from iter_batches(stream, self.record_format)
            except ValueError as exc:  # framing errors
                raise PipeModeDatasetException(
                    f"channel {self.channel!r}, epoch {epoch}: {exc}"
                ) from None

    def records(self) -> Iterator[bytes]:
        for batch in self.batches():
            yield from batch
