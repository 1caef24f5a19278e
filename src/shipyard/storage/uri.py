"""Parsing storage URIs and finding the S3 endpoint.

The endpoint follows the AWS convention so any S3 API (MinIO, Ceph, moto) works:
an explicit value, else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, else
``s3.endpoint_url`` in ``$SHIPYARD_HOME/config.json``, else boto3's default (AWS).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from shipyard import settings
from shipyard.errors import ValidationError


@dataclass(frozen=True)
class Location:
    """A parsed URI: ``scheme`` is "s3" or "file"; for s3 ``bucket`` + ``key``
    (a key or key prefix, may be ""), for file ``path`` (absolute)."""

    scheme: str
    bucket: str = ""
    key: str = ""
    path: str = ""

    @property
    def uri(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.key}"
        return "file://" + self.path

    def child(self, relative: str) -> Location:
        """The location ``relative`` below this one (a "directory" join)."""
        relative = relative.lstrip("/")
        if self.scheme == "s3":
            base = self.key if not self.key or self.key.endswith("/") else self.key + "/"
            return Location("s3", self.bucket, base + relative)
        return Location("file", path=os.path.join(self.path, relative))


def is_remote(uri: str) -> bool:
    return uri.startswith("s3://")


def parse(uri: str) -> Location:
    """``s3://bucket/key``, ``file:///abs/path`` or a plain path -> Location."""
    if uri.startswith("s3://"):
        rest = uri[len("s3://") :]
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ValidationError(f"{uri!r} has no bucket name; write s3://<bucket>/<prefix>")
        return Location("s3", bucket, key)
    if uri.startswith("file://"):
        return Location("file", path=os.path.abspath(uri[len("file://") :]))
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise ValidationError(
            f"{uri!r}: {scheme}:// is not supported; use s3://, file:// or a local path"
        )
    return Location("file", path=os.path.abspath(os.path.expanduser(uri)))


def _config_endpoint() -> str | None:
    home = os.path.abspath(os.path.expanduser(settings.text("SHIPYARD_HOME")))
    path = os.path.join(home, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    value = (data.get("s3") or {}).get("endpoint_url") if isinstance(data, dict) else None
    return str(value) if value else None


def endpoint_url(explicit: str | None = None) -> str | None:
    """The S3 endpoint to use (None: boto3's default, i.e. AWS itself)."""
    return (
        explicit
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or _config_endpoint()
    )


def local_path(uri: str) -> str:
    """A local path or file:// URI -> absolute local path; other schemes are refused."""
    if uri.startswith("file://"):
        return os.path.abspath(uri[len("file://") :])
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise ValidationError(
            f"{uri!r}: {scheme}:// locations are not supported yet for this setting; "
            "use a local path or file://"
        )
    return os.path.abspath(os.path.expanduser(uri))
