"""Object storage behind channels, artifacts and checkpoints: local paths, file://, s3://.

One small interface (``storage.api.Store``) with two implementations: ``LocalStore``
(a directory tree) and ``S3Store`` (boto3 against any S3 API). Everything above it --
the control plane checking a channel at submission, the agent staging File channels,
feeding Pipe FIFOs, serving FastFile reads, syncing checkpoints -- talks to a Store and
never to boto3 directly, so the same code path serves a laptop and a cluster.
"""

from __future__ import annotations

from shipyard.storage.api import ObjectInfo, Store
from shipyard.storage.listing import list_channel, store_for
from shipyard.storage.uri import Location, endpoint_url, is_remote, parse

__all__ = [
    "Location",
    "ObjectInfo",
    "Store",
    "endpoint_url",
    "is_remote",
    "list_channel",
    "parse",
    "store_for",
]
