"""Pipe mode: feed a channel's objects into FIFOs ``input/data/<channel>_<epoch>``.

One feeder process per Pipe channel (a ``service`` of the instance: stopped when the
script ends, so a script that never opens its FIFO does not hold the job). Per epoch it
waits for a reader (non-blocking open, polled, so a stop is never held up), streams
every object of the instance's share in key order -- gunzipped for
``CompressionType=Gzip``, each object wrapped as one RecordIO record for
``RecordWrapperType=RecordIO``, RecordIO framing checked for ``application/x-recordio``
content -- then creates the next epoch's FIFO *before* closing this one, so a reader
that sees end-of-file always finds the next epoch waiting. A reader that closes early
ends the epoch (as in SageMaker). Any object that cannot be read or decoded ends the
feeder with a failure text naming the object, which fails the instance.

Run by ``python -m shipyard.agent.channels.feeder --source <agent>/pipe-X.json --input-data DIR``.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import zlib
from collections.abc import Iterator

from shipyard.data import recordio
from shipyard.errors import ShipyardError
from shipyard.runtime import safepath
from shipyard.storage import ObjectInfo, Store

RECORDIO_TYPES = ("application/x-recordio", "application/x-recordio-protobuf")
CHUNK = 1 << 20


class FeedError(ShipyardError):
    """An object could not be streamed; the message names it."""


def fifo_path(input_data: str, channel: str, epoch: int) -> str:
    return os.path.join(input_data, f"{channel}_{epoch}")


def make_fifo(path: str) -> None:
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        pass


def object_bytes(
    store: Store, obj: ObjectInfo, gzip: bool, wrap: bool, check_recordio: bool
) -> Iterator[bytes]:
    """The bytes of one object as the script must see them."""
    try:
        body = store.open(obj.location)
        try:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
            check = recordio.Splitter() if check_recordio else None
            pending: list[bytes] | None = [] if wrap else None
            for chunk in iter(lambda: body.read(CHUNK), b""):
                if inflate is not None:
                    chunk, inflate = _gunzip(inflate, chunk)
                if check is not None:
                    check.feed(chunk)
                if pending is not None:
                    pending.append(chunk)
                elif chunk:
                    yield chunk
            if inflate is not None:
                tail = inflate.flush()
                if not inflate.eof:
                    raise zlib.error("the gzip stream is truncated")
                if check is not None:
                    check.feed(tail)
                if pending is not None:
                    pending.append(tail)
                elif tail:
                    yield tail
            if check is not None:
                check.close()
            if pending is not None:
                yield recordio.wrap(b"".join(pending))
        finally:
            body.close()
    except zlib.error as exc:
        raise FeedError(
            f"object {obj.uri} is not valid gzip ({exc}); the channel has CompressionType=Gzip"
        ) from None
    except recordio.RecordIOError as exc:
        raise FeedError(f"object {obj.uri} has corrupt RecordIO framing: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - storage errors, dropped connections
        raise FeedError(f"object {obj.uri} could not be read: {exc}") from None


def _gunzip(inflate, data: bytes):
    """Decompress ``data``, continuing into the next member of a multi-member gzip file
    (what ``cat a.gz b.gz`` makes; gzip -d reads all members, so do we)."""
    out = [inflate.decompress(data)]
    while inflate.eof and inflate.unused_data:
        rest = inflate.unused_data
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out.append(inflate.decompress(rest))
    return b"".join(out), inflate


def open_writer(path: str, poll: float = 0.02, root: str | None = None) -> int:
    """Wait for a reader of the FIFO, then return a blocking write descriptor.

    The FIFO is in the job's tree and the feeder writes as root in the host's filesystem:
    it is opened below ``root`` (the tree) without following a link, and anything but a
    FIFO there (the job replaced it with a link or a file) is refused, never written."""
    while True:
        try:
            if root is not None:
                fd = safepath.open_beneath(root, path, os.O_WRONLY | os.O_NONBLOCK)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nobody has it open for reading yet
                raise
            time.sleep(poll)
            continue
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not the channel's FIFO (replaced by the job?)", path)
        os.set_blocking(fd, True)
        return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def feed(
    store: Store,
    objects: list[ObjectInfo],
    input_data: str,
    channel: str,
    options: dict,
    epochs: int | None = None,
    log=print,
) -> None:
    gzip = options.get("CompressionType") == "Gzip"
    wrap = options.get("RecordWrapperType") == "RecordIO"
    check = (not wrap) and options.get("ContentType") in RECORDIO_TYPES
    epoch = 0
    make_fifo(fifo_path(input_data, channel, 0))
    while epochs is None or epoch < epochs:
        path = fifo_path(input_data, channel, epoch)
        fd = open_writer(path, root=os.path.dirname(os.path.dirname(input_data)))
        written = 0
        try:
            for obj in objects:
                for data in object_bytes(store, obj, gzip, wrap, check):
                    write_all(fd, data)
                    written += len(data)
        except BrokenPipeError:
            log(f"channel {channel}: the reader closed epoch {epoch} after {written} bytes")
        # On a FeedError the FIFO stays open until this process has exited: the reader
        # must not see a clean end of the epoch before the instance knows it failed.
        make_fifo(fifo_path(input_data, channel, epoch + 1))
        os.close(fd)
        os.unlink(path)
        log(f"channel {channel}: epoch {epoch} fed ({written / 1e6:.1f} MB)")
        epoch += 1
