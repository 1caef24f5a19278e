"""``shipyard.deserializers`` (as ``sagemaker.deserializers``)."""

from shipyard.sdk.deserializers import (
    BaseDeserializer,
    BytesDeserializer,
    CSVDeserializer,
    JSONDeserializer,
    JSONLinesDeserializer,
    NumpyDeserializer,
    StreamDeserializer,
    StringDeserializer,
)

__all__ = [
    "BaseDeserializer",
    "BytesDeserializer",
    "CSVDeserializer",
    "JSONDeserializer",
    "JSONLinesDeserializer",
    "NumpyDeserializer",
    "StreamDeserializer",
    "StringDeserializer",
]
