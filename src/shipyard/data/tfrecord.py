"""TFRecord framing without TensorFlow (the torch reader and the Pipe reader use it).

A record is: length (uint64 LE), masked CRC32C of the length (uint32), data, masked
CRC32C of the data (uint32). The length CRC is always checked (it catches a stream that
is not TFRecord at all, or lost sync); the data CRC only with ``verify=True``, since a
pure-Python CRC32C costs ~0.1 ms per KB.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from shipyard.errors import ShipyardError


class TFRecordError(ShipyardError, ValueError):
    """The bytes are not valid TFRecord framing."""


def _table() -> list[int]:
    poly = 0x82F63B78
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def encode(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return (
        length
        + struct.pack("<I", masked_crc(length))
        + record
        + struct.pack("<I", masked_crc(record))
    )


def write(path: str, records: Iterable[bytes]) -> None:
    """Write a TFRecord file (tf.io.TFRecordWriter when TensorFlow is importable: fast)."""
    try:
        import tensorflow as tf
    except ImportError:
        with open(path, "wb") as fh:
            fh.writelines(encode(record) for record in records)
        return
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


class Splitter:
    """Incremental TFRecord parser: feed() bytes, get complete records back."""

    def __init__(self, verify: bool = False) -> None:
        self.buffer = bytearray()
        self.verify = verify
        self.offset = 0
        self._checked: dict[bytes, bool] = {}

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        buf = self.buffer
        out = []
        pos = 0
        while len(buf) - pos >= 12:
            head = bytes(buf[pos : pos + 8])
            ok = self._checked.get(head)
            if ok is None:
                (crc,) = struct.unpack_from("<I", buf, pos + 8)
                ok = masked_crc(head) == crc
                if len(self._checked) < 4096:
                    self._checked[head] = ok
            if not ok:
                raise TFRecordError(f"corrupt TFRecord length header at byte {self.offset + pos}")
            (length,) = struct.unpack("<Q", head)
            end = pos + 12 + length + 4
            if len(buf) < end:
                break
            record = bytes(buf[pos + 12 : pos + 12 + length])
            if self.verify:
                (crc,) = struct.unpack_from("<I", buf, end - 4)
                if masked_crc(record) != crc:
                    raise TFRecordError(f"TFRecord data CRC mismatch at byte {self.offset + pos}")
            out.append(record)
            pos = end
        del buf[:pos]
        self.offset += pos
        return out

    def close(self) -> None:
        if self.buffer:
            raise TFRecordError(
                f"data ends inside a TFRecord (byte {self.offset}, "
                f"{len(self.buffer)} bytes left over)"
            )


def read(stream, chunk: int = 1 << 20, verify: bool = False) -> Iterator[bytes]:
    splitter = Splitter(verify)
    while True:
        data = stream.read(chunk)
        if not data:
            splitter.close()
            return
        yield from splitter.feed(data)
