"""Serializers: Python data -> request body (mirrors ``sagemaker.serializers``).

Each has ``CONTENT_TYPE`` and ``serialize(data) -> bytes | str``; the Predictor sends
``content_type`` as the request's Content-Type.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import numpy as np


class BaseSerializer:
    CONTENT_TYPE = "application/octet-stream"

    def __init__(self, content_type: str | None = None) -> None:
        self._content_type = content_type or self.CONTENT_TYPE

    @property
    def content_type(self) -> str:
        return self._content_type

    def serialize(self, data: Any) -> Any:
        raise NotImplementedError


SimpleBaseSerializer = BaseSerializer


def _read(data: Any) -> Any:
    """Open files and file paths are sent as they are (the SDK's ``_serialize_file``)."""
    if hasattr(data, "read"):
        return data.read()
    return data


class IdentitySerializer(BaseSerializer):
    """Bytes (or a file) as they are."""

    def serialize(self, data: Any) -> Any:
        return _read(data)


class StringSerializer(BaseSerializer):
    CONTENT_TYPE = "text/plain"

    def __init__(self, content_type: str | None = None, encoding: str = "utf-8") -> None:
        super().__init__(content_type)
        self.encoding = encoding

    def serialize(self, data: Any) -> bytes:
        return str(data).encode(self.encoding)


class DataSerializer(IdentitySerializer):
    CONTENT_TYPE = "file-path/raw-bytes"

    def serialize(self, data: Any) -> Any:
        if isinstance(data, str):
            with open(data, "rb") as fh:
                return fh.read()
        return _read(data)


class JSONSerializer(BaseSerializer):
    CONTENT_TYPE = "application/json"

    def serialize(self, data: Any) -> Any:
        data = _read(data)
        if isinstance(data, (bytes, str)):
            return data
        return json.dumps(_plain(data))


class JSONLinesSerializer(BaseSerializer):
    CONTENT_TYPE = "application/jsonlines"

    def serialize(self, data: Any) -> Any:
        data = _read(data)
        if isinstance(data, (bytes, str)):
            return data
        if not isinstance(data, (list, tuple)) and not hasattr(data, "tolist"):
            raise ValueError("JSONLinesSerializer needs a list of records")
        return "".join(json.dumps(_plain(row)) + "\n" for row in _plain(data))


class CSVSerializer(BaseSerializer):
    CONTENT_TYPE = "text/csv"

    def serialize(self, data: Any) -> Any:
        data = _read(data)
        if isinstance(data, (bytes, str)):
            return data
        data = _plain(data)
        if not isinstance(data, list):
            return str(data)
        rows = data if data and isinstance(data[0], list) else [data]
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in rows:
            writer.writerow([repr(v) if isinstance(v, float) else v for v in row])
        return buf.getvalue().rstrip("\n")


class NumpySerializer(BaseSerializer):
    CONTENT_TYPE = "application/x-npy"

    def __init__(self, dtype: Any = None, content_type: str | None = None) -> None:
        super().__init__(content_type)
        self.dtype = dtype

    def serialize(self, data: Any) -> Any:
        data = _read(data)
        if isinstance(data, bytes):
            return data
        buf = io.BytesIO()
        np.save(buf, np.asarray(data, dtype=self.dtype), allow_pickle=False)
        return buf.getvalue()


def _plain(data: Any) -> Any:
    if hasattr(data, "tolist"):
        return data.tolist()
    if isinstance(data, tuple):
        return list(data)
    return data
