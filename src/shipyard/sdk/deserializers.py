"""Deserializers: response body -> Python data (mirrors ``sagemaker.deserializers``).

Each has ``ACCEPT`` (a tuple of media types; the Predictor sends the first as Accept)
and ``deserialize(stream, content_type)``; the stream is a file-like response body.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import numpy as np


class BaseDeserializer:
    ACCEPT: tuple[str, ...] = ("*/*",)

    def __init__(self, accept: Any = None) -> None:
        self._accept = (accept,) if isinstance(accept, str) else tuple(accept or self.ACCEPT)

    @property
    def accept(self) -> tuple[str, ...]:
        return self._accept

    def deserialize(self, stream: Any, content_type: str) -> Any:
        raise NotImplementedError


SimpleBaseDeserializer = BaseDeserializer


def _body(stream: Any) -> bytes:
    try:
        return stream.read()
    finally:
        close = getattr(stream, "close", None)
        if close:
            close()


class BytesDeserializer(BaseDeserializer):
    def deserialize(self, stream: Any, content_type: str) -> bytes:
        return _body(stream)


class StringDeserializer(BaseDeserializer):
    ACCEPT = ("application/json",)

    def __init__(self, encoding: str = "UTF-8", accept: Any = None) -> None:
        super().__init__(accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> str:
        return _body(stream).decode(self.encoding)


class StreamDeserializer(BaseDeserializer):
    def deserialize(self, stream: Any, content_type: str) -> tuple[Any, str]:
        return stream, content_type


class JSONDeserializer(BaseDeserializer):
    ACCEPT = ("application/json",)

    def deserialize(self, stream: Any, content_type: str) -> Any:
        return json.loads(_body(stream))


class JSONLinesDeserializer(BaseDeserializer):
    ACCEPT = ("application/jsonlines",)

    def deserialize(self, stream: Any, content_type: str) -> list[Any]:
        return [
            json.loads(line) for line in _body(stream).decode("utf-8").splitlines() if line.strip()
        ]


class CSVDeserializer(BaseDeserializer):
    ACCEPT = ("text/csv",)

    def __init__(self, encoding: str = "utf-8", accept: Any = None) -> None:
        super().__init__(accept)
        self.encoding = encoding

    def deserialize(self, stream: Any, content_type: str) -> list[list[str]]:
        return list(csv.reader(io.StringIO(_body(stream).decode(self.encoding))))


class NumpyDeserializer(BaseDeserializer):
    ACCEPT = ("application/x-npy",)

    def __init__(self, dtype: Any = None, accept: Any = None, allow_pickle: bool = False) -> None:
        super().__init__(accept)
        self.dtype = dtype
        self.allow_pickle = allow_pickle

    def deserialize(self, stream: Any, content_type: str) -> np.ndarray:
        body = _body(stream)
        ctype = (content_type or "").split(";")[0].strip()
        if ctype == "text/csv":
            return np.genfromtxt(io.StringIO(body.decode()), delimiter=",", dtype=self.dtype)
        if ctype == "application/json":
            return np.array(json.loads(body), dtype=self.dtype)
        if ctype == "application/x-npy":
            return np.load(io.BytesIO(body), allow_pickle=self.allow_pickle)
        raise ValueError(f"NumpyDeserializer cannot read {content_type!r}")
