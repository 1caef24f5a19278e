"""PipeDataset: a Pipe-mode channel as a torch IterableDataset.

Each ``iter()`` reads the channel's next epoch (the epoch state is shared with
PipeModeDataset, so mixing both in one job keeps counting). A FIFO has exactly one
reader: use it with ``DataLoader(num_workers=0)`` or ``1``; with more workers only
worker 0 reads (the others yield nothing) rather than splitting one stream wrongly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch.utils.data import IterableDataset, get_worker_info

from shipyard.data.pipe import EpochReader, PipeModeDatasetException

__all__ = ["PipeDataset", "PipeModeDatasetException"]


class PipeDataset(IterableDataset):
    def __init__(
        self,
        channel: str,
        record_format: str = "RecordIO",
        transform: Callable[[bytes], object] | None = None,
        state_dir: str | None = None,
        pipe_dir: str | None = None,
        config_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.reader = EpochReader(channel, record_format, state_dir, pipe_dir, config_dir)
        self.transform = transform
        self.epochs_read: list[int] = []

    def __iter__(self) -> Iterator[object]:
        info = get_worker_info()
        if info is not None and info.id != 0:
            return iter(())
        return self._records()

    def _records(self) -> Iterator[object]:
        self.reader.on_open = self.epochs_read.append
        transform = self.transform
        for batch in self.reader.batches():
            if transform is None:
                yield from batch
            else:
                for record in batch:
                    yield transform(record)
