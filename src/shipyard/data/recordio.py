"""MXNet/dmlc RecordIO framing, as SageMaker's RecordWrapperType=RecordIO writes it.

A record is: magic 0xced7230a (uint32 LE), ``lrecord`` (uint32 LE: continuation flag in
the top 3 bits, length in the low 29), the data, zero padding to a multiple of 4.
Writers here emit whole records (flag 0); readers also join multi-part records
(flags 1, 2, 3: dmlc splits a record where it contains the magic, and the magic is put
back between the parts).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from shipyard.errors import ShipyardError

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
MAX_LENGTH = (1 << 29) - 1


class RecordIOError(ShipyardError, ValueError):
    """The bytes are not valid RecordIO framing."""


def header(length: int) -> bytes:
    if length > MAX_LENGTH:
        raise RecordIOError(f"a RecordIO record holds at most {MAX_LENGTH} bytes, got {length}")
    return struct.pack("<II", MAGIC, length)


def padding(length: int) -> bytes:
    return b"\0" * (-length % 4)


def wrap(data: bytes) -> bytes:
    """One record holding ``data``."""
    return header(len(data)) + data + padding(len(data))


def write(records: Iterable[bytes], fh) -> None:
    for record in records:
        fh.write(wrap(record))


class Splitter:
    """Incremental RecordIO parser: feed() bytes, get complete records back.

    Used by the readers and by the Pipe feeder to check framing while it streams an
    object (so a corrupt object is named before a script chokes on it).
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.parts: list[bytes] = []
        self.offset = 0  # bytes consumed so far, for error messages

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        out = []
        pos = 0
        buf = self.buffer
        while len(buf) - pos >= 8:
            magic, lrec = struct.unpack_from("<II", buf, pos)
            if magic != MAGIC:
                raise RecordIOError(
                    f"bad RecordIO magic 0x{magic:08x} at byte "
                    f"{self.offset + pos} (expected 0x{MAGIC:08x})"
                )
            length, flag = lrec & MAX_LENGTH, lrec >> 29
            total = 8 + length + (-length % 4)
            if len(buf) - pos < total:
                break
            data = bytes(buf[pos + 8 : pos + 8 + length])
            pos += total
            if flag == 0:
                if self.parts:
                    raise RecordIOError(
                        f"record at byte {self.offset + pos - total} starts "
                        "before the previous multi-part record ended"
                    )
                out.append(data)
            elif flag in (1, 2):
                if (flag == 1) == bool(self.parts):
                    raise RecordIOError(
                        f"unexpected continuation flag {flag} at byte {self.offset + pos - total}"
                    )
                self.parts.append(data)
            elif flag == 3:
                if not self.parts:
                    raise RecordIOError(
                        f"end-of-record flag without a start at byte {self.offset + pos - total}"
                    )
                self.parts.append(data)
                out.append(MAGIC_BYTES.join(self.parts))
                self.parts = []
            else:
                raise RecordIOError(
                    f"invalid continuation flag {flag} at byte {self.offset + pos - total}"
                )
        del buf[:pos]
        self.offset += pos
        return out

    def close(self) -> None:
        """At the end of the data: anything left over is a truncated record."""
        if self.buffer or self.parts:
            raise RecordIOError(
                f"data ends inside a record (byte {self.offset}, "
                f"{len(self.buffer)} bytes left over)"
            )


def read(stream, chunk: int = 1 << 20) -> Iterator[bytes]:
    splitter = Splitter()
    while True:
        data = stream.read(chunk)
        if not data:
            splitter.close()
            return
        yield from splitter.feed(data)
