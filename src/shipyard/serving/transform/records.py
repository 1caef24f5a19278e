"""Batch transform pieces (pure functions): split records, group them into requests,
filter with JSONPath, split answers back per record, join with the input.

Follows SageMaker batch transform: ``split_type`` None (the file is one record) | Line
| RecordIO | TFRecord; ``MultiRecord`` packs as many records as fit in MaxPayloadInMB
into one request, ``SingleRecord`` sends one each; ``input_filter``/``output_filter``
are JSONPath (``$``, ``$[1:]``, ``$[0,2]``, ``$.key``, ``$['a','b']``) applied to each
CSV row (as a list) or JSON record; ``join_source='Input'`` puts the input record
beside its output (CSV: ``input,output``; JSON object: under ``SageMakerOutput``;
JSON array: appended).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from typing import Any

from shipyard.errors import ValidationError

SPLIT_TYPES = (None, "None", "Line", "RecordIO", "TFRecord")
_RECORDIO_MAGIC = 0xCED7230A


def split_records(data: bytes, split_type: str | None) -> list[bytes]:
    """A file's bytes -> its records (framing kept for RecordIO/TFRecord)."""
    if split_type in (None, "None"):
        return [data] if data else []
    if split_type == "Line":
        return [ln for ln in data.split(b"\n") if ln.strip()]
    if split_type == "RecordIO":
        return list(_recordio(data))
    if split_type == "TFRecord":
        return list(_tfrecord(data))
    raise ValidationError(f"split_type {split_type!r}: use None, 'Line', 'RecordIO' or 'TFRecord'")


def _recordio(data: bytes) -> Iterator[bytes]:
    pos = 0
    while pos < len(data):
        if len(data) - pos < 8:
            raise ValidationError(f"truncated RecordIO header at byte {pos}")
        magic, lrec = struct.unpack_from("<II", data, pos)
        if magic != _RECORDIO_MAGIC:
            raise ValidationError(f"not RecordIO: bad magic at byte {pos}")
        length = lrec & ((1 << 29) - 1)
        end = pos + 8 + length + (-length % 4)
        yield data[pos:end]
        pos = end


def _tfrecord(data: bytes) -> Iterator[bytes]:
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise ValidationError(f"truncated TFRecord header at byte {pos}")
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        if end > len(data):
            raise ValidationError(f"truncated TFRecord at byte {pos}")
        yield data[pos:end]
        pos = end


def mini_batches(
    records: list[bytes], strategy: str | None, max_payload: int, split_type: str | None
) -> list[tuple[int, int]]:
    """Record index ranges [start, end) for each request, each under ``max_payload``
    bytes when it can be (a single larger record goes alone; the server judges it)."""
    if strategy == "SingleRecord" or split_type in (None, "None"):
        return [(i, i + 1) for i in range(len(records))]
    sep = 1 if split_type == "Line" else 0
    out, start, size = [], 0, 0
    for i, rec in enumerate(records):
        extra = len(rec) + (sep if i > start else 0)
        if i > start and (max_payload and size + extra > max_payload):
            out.append((start, i))
            start, size, extra = i, 0, len(rec)
        size += extra
    if start < len(records):
        out.append((start, len(records)))
    return out


def join_payload(records: list[bytes], split_type: str | None) -> bytes:
    return (b"\n" if split_type == "Line" else b"").join(records)


# -- JSONPath subset -------------------------------------------------------------------------
_SEGMENT = re.compile(r"\.([A-Za-z_][\w-]*)|\[([^\]]*)\]")


def jsonpath(expr: str, value: Any) -> Any:
    """Apply a JSONPath subset; ValidationError for an expression outside it."""
    expr = expr.strip()
    if not expr.startswith("$"):
        raise ValidationError(f"JSONPath {expr!r} must start with '$'")
    pos = 1
    while pos < len(expr):
        m = _SEGMENT.match(expr, pos)
        if not m:
            raise ValidationError(f"JSONPath {expr!r}: cannot read from position {pos}")
        pos = m.end()
        if m.group(1) is not None:
            value = value[m.group(1)] if isinstance(value, dict) else None
            continue
        inner = m.group(2).strip()
        if inner == "*":
            continue
        if ":" in inner:
            parts = [int(p) if p.strip() else None for p in inner.split(":")]
            value = value[slice(*parts)]
        elif "," in inner or inner.startswith(("'", '"')):
            keys = [_key(k) for k in inner.split(",")]
            value = (
                {k: value[k] for k in keys if k in value}
                if isinstance(value, dict)
                else [value[k] for k in keys]
            )
        else:
            value = value[_key(inner)]
    return value


def _key(text: str) -> Any:
    text = text.strip()
    if text[:1] in ("'", '"'):
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        raise ValidationError(
            f"JSONPath index {text!r} is neither a number nor a quoted name"
        ) from None


def _parse(record: bytes, content_type: str) -> tuple[Any, str]:
    if "csv" in content_type:
        return record.decode("utf-8").split(","), "csv"
    return json.loads(record), "json"


def _render(value: Any, kind: str) -> bytes:
    if kind == "csv":
        return (",".join(str(v) for v in value) if isinstance(value, list) else str(value)).encode()
    return json.dumps(value, separators=(",", ":")).encode()


def filter_input(record: bytes, expr: str | None, content_type: str) -> bytes:
    if not expr or expr == "$":
        return record
    value, kind = _parse(record, content_type)
    return _render(jsonpath(expr, value), kind)


def join_output(
    record: bytes,
    output: bytes,
    join_source: str | None,
    output_filter: str | None,
    content_type: str,
    accept: str,
) -> bytes:
    """One record's output, joined with its input and filtered, as SageMaker does."""
    if join_source in (None, "None") and (not output_filter or output_filter == "$"):
        return output
    if join_source == "Input":
        if "csv" in content_type and "json" not in accept:
            joined = record + b"," + output
            value, kind = _parse(joined, "text/csv")
        else:
            inp, out = json.loads(record), json.loads(output)
            if isinstance(inp, dict):
                value = {**inp, "SageMakerOutput": out}
            elif isinstance(inp, list):
                value = inp + [out]
            else:
                value = [inp, out]
            kind = "json"
    else:
        value, kind = _parse(output, accept)
    if output_filter and output_filter != "$":
        value = jsonpath(output_filter, value)
    return _render(value, kind)


def per_record_outputs(body: bytes, count: int) -> list[bytes] | None:
    """A response for ``count`` records -> one output per record, or None if it cannot
    be aligned (one object for the whole mini-batch, as a JSON model answers)."""
    lines = [ln for ln in body.rstrip(b"\n").split(b"\n")] if body.strip() else []
    if len(lines) == count:
        return lines
    if count == 1:
        return [body.rstrip(b"\n")]
    try:
        data = json.loads(body)
    except ValueError:
        return None
    preds = data.get("predictions") if isinstance(data, dict) else data
    if isinstance(preds, list) and len(preds) == count:
        return [json.dumps(p, separators=(",", ":")).encode() for p in preds]
    return None
