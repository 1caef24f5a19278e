"""``shipyard.serializers`` (as ``sagemaker.serializers``)."""

from shipyard.sdk.serializers import (
    BaseSerializer,
    CSVSerializer,
    DataSerializer,
    IdentitySerializer,
    JSONLinesSerializer,
    JSONSerializer,
    NumpySerializer,
    StringSerializer,
)

__all__ = [
    "BaseSerializer",
    "CSVSerializer",
    "DataSerializer",
    "IdentitySerializer",
    "JSONLinesSerializer",
    "JSONSerializer",
    "NumpySerializer",
    "StringSerializer",
]
