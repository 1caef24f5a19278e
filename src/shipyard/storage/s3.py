"""S3Store: boto3 against any S3 API, with bounded retries and errors that say what to do.

Uploads and downloads go through boto3's transfer manager: above
``SHIPYARD_S3_MULTIPART_THRESHOLD`` bytes an object moves in parts, several at once, each
part retried on its own (a single PutObject stops at 5 GiB; a single-stream GET restarts
from zero on a dropped connection).

Every call goes through ``_call`` so the three failures users hit -- a bucket or key
that does not exist, credentials the endpoint refuses, an endpoint that does not
answer -- become one StorageError each with the endpoint named, after botocore's
bounded retries (``standard`` mode, 3 attempts, short connect timeout). An endpoint that
is away (no connection, a dropped one, a timeout, a 5xx) is a ``StorageUnavailableError``,
which a caller with time to spare retries (``storage.retry``: a finished job's artifacts).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

from shipyard import settings
from shipyard.errors import StorageError, StorageUnavailableError
from shipyard.storage.api import ObjectInfo
from shipyard.storage.uri import Location, endpoint_url

T = TypeVar("T")
MIN_PART = 5 << 20  # S3's smallest part (all but the last)
_CLIENTS: dict[tuple[str | None, int], Any] = {}
_LOCK = threading.Lock()
_UNAVAILABLE_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "503"}
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "403",
}


def client(endpoint: str | None = None) -> Any:
    """One boto3 S3 client per (endpoint, process): clients are thread-safe, sessions not."""
    import boto3
    from botocore.config import Config

    key = (endpoint_url(endpoint), os.getpid())
    with _LOCK:
        if key not in _CLIENTS:
            attempts = settings.integer("SHIPYARD_S3_MAX_ATTEMPTS")
            config = Config(
                retries={"max_attempts": attempts, "mode": "standard"},
                connect_timeout=settings.number("SHIPYARD_S3_CONNECT_TIMEOUT"),
                read_timeout=60,
                max_pool_connections=32,
                s3={"addressing_style": "path"},
            )
            region = (
                os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            )
            _CLIENTS[key] = boto3.session.Session().client(
                "s3", endpoint_url=key[0], region_name=region, config=config
            )
        return _CLIENTS[key]


def transfer_config() -> Any:
    """Multipart threshold/part size from SHIPYARD_S3_MULTIPART_THRESHOLD (bytes, at least
    S3's 5 MiB part minimum for the parts), SHIPYARD_S3_TRANSFER_THREADS parallel parts."""
    from boto3.s3.transfer import TransferConfig

    threshold = settings.integer("SHIPYARD_S3_MULTIPART_THRESHOLD")
    return TransferConfig(
        multipart_threshold=threshold,
        multipart_chunksize=max(threshold, MIN_PART),
        max_concurrency=settings.integer("SHIPYARD_S3_TRANSFER_THREADS"),
        num_download_attempts=settings.integer("SHIPYARD_S3_MAX_ATTEMPTS") + 2,
    )


class S3Store:
    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint_url(endpoint)
        self.s3 = client(self.endpoint)

    # -- error translation ----------------------------------------------------------------
    def _where(self) -> str:
        return self.endpoint or "the default AWS endpoint"

    def _call(self, what: str, location: Location, fn: Callable[[], T]) -> T:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        try:
            return fn()
        except S3UploadFailedError as exc:
            if _unavailable(exc.__context__):
                raise StorageUnavailableError(
                    f"the S3 endpoint {self._where()} did not answer ({what} "
                    f"{location.uri}; the multipart upload was aborted): {exc}"
                ) from None
            raise StorageError(
                f"{what} {location.uri} failed at {self._where()} (the multipart upload was "
                f"aborted, nothing was written): {exc}"
            ) from None
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if _unavailable(exc):
                raise StorageUnavailableError(
                    f"the S3 endpoint {self._where()} answered {code} ({what} {location.uri}) "
                    "after retries: it is not serving requests now"
                ) from None
            if code in ("NoSuchBucket",):
                raise StorageError(
                    f"bucket {location.bucket!r} does not exist at "
                    f"{self._where()} ({what} {location.uri})"
                ) from None
            if code in ("NoSuchKey", "404", "NotFound"):
                raise StorageError(
                    f"{location.uri} does not exist at {self._where()} ({what})"
                ) from None
            if code in _CREDENTIAL_CODES:
                raise StorageError(
                    f"{self._where()} refused the credentials ({code}) for {what} "
                    f"{location.uri}: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                    "or the profile in use"
                ) from None
            raise StorageError(
                f"{what} {location.uri} failed at {self._where()}: {code}: {exc}"
            ) from None
        except NoCredentialsError:
            raise StorageError(
                f"no AWS credentials found for {what} {location.uri}: set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any value for "
                "a local S3 server)"
            ) from None
        except (BotoConnectionError, HTTPClientError) as exc:
            raise StorageUnavailableError(
                f"the S3 endpoint {self._where()} did not answer ({what} "
                f"{location.uri}) after retries: {exc}"
            ) from None

    # -- Store ----------------------------------------------------------------------------
    def list(self, prefix: Location) -> list[ObjectInfo]:
        def _list() -> list[tuple[str, int]]:
            found = []
            pages = self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=prefix.bucket, Prefix=prefix.key
            )
            for page in pages:
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):
                        found.append((item["Key"], int(item["Size"])))
            return found

        found = self._call("listing", prefix, _list)
        base = _base_of(prefix.key, [k for k, _ in found])
        out = [
            ObjectInfo(Location("s3", prefix.bucket, key), size, key[len(base) :])
            for key, size in found
        ]
        return sorted(out, key=lambda o: o.location.key)

    def info(self, location: Location) -> ObjectInfo:
        head = self._call(
            "reading",
            location,
            lambda: self.s3.head_object(Bucket=location.bucket, Key=location.key),
        )
        return ObjectInfo(location, int(head["ContentLength"]), location.key.rsplit("/", 1)[-1])

    def open(self, location: Location) -> BinaryIO:
        resp = self._call(
            "reading",
            location,
            lambda: self.s3.get_object(Bucket=location.bucket, Key=location.key),
        )
        return resp["Body"]

    def read_range(self, location: Location, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        resp = self._call(
            "reading",
            location,
            lambda: self.s3.get_object(
                Bucket=location.bucket,
                Key=location.key,
                Range=f"bytes={start}-{start + length - 1}",
            ),
        )
        return resp["Body"].read()

    def download(self, obj: ObjectInfo, dest: str) -> None:
        """Parallel ranged GETs (each part retried) into a temporary name, then renamed."""
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".shipyard-")
        os.close(fd)
        loc = obj.location
        try:
            self._call(
                "reading",
                loc,
                lambda: self.s3.download_file(loc.bucket, loc.key, tmp, Config=transfer_config()),
            )
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def upload(
        self, path: str, location: Location, callback: Callable[[int], None] | None = None
    ) -> None:
        """Multipart above the threshold: parts in parallel, each retried; an object
        appears only when every part is in (a failed upload is aborted). ``callback``
        is the transfer manager's: bytes sent, from its threads (a retried part's bytes
        are first taken back with a negative count)."""
        self._call(
            "uploading to",
            location,
            lambda: self.s3.upload_file(
                path, location.bucket, location.key, Config=transfer_config(), Callback=callback
            ),
        )

    def delete(self, location: Location) -> None:
        self._call(
            "deleting",
            location,
            lambda: self.s3.delete_object(Bucket=location.bucket, Key=location.key),
        )

    def abort_incomplete_uploads(self, prefix: Location) -> int:
        """Abort multipart uploads under ``prefix`` that never completed (an upload
        interrupted by a killed process leaves its parts stored, invisible and billed);
        returns how many were aborted."""

        def _abort() -> int:
            count = 0
            pages = self.s3.get_paginator("list_multipart_uploads").paginate(
                Bucket=prefix.bucket, Prefix=prefix.key
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    self.s3.abort_multipart_upload(
                        Bucket=prefix.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    count += 1
            return count

        return self._call("aborting uploads under", prefix, _abort)

    def exists(self, location: Location) -> bool:
        """Whether the object exists (the bucket, for a location without a key)."""
        if not location.key:
            return self.bucket_exists(location)
        try:
            self.info(location)
        except StorageError as exc:
            if "does not exist" in str(exc):
                return False
            raise
        return True

    def bucket_exists(self, location: Location) -> bool:
        """Whether the bucket that would hold ``location`` exists."""
        try:
            self._call("checking", location, lambda: self.s3.head_bucket(Bucket=location.bucket))
        except StorageError as exc:
            if "does not exist" in str(exc):
                return False
            raise
        return True


def _unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the endpoint is away rather than that the request is wrong: no
    connection, a dropped one, a timeout, or a 5xx answer (a server starting or stopping)."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = str(exc.response.get("Error", {}).get("Code", ""))
        return int(status) >= 500 or code in _UNAVAILABLE_CODES
    return False


def _base_of(prefix: str, keys: list[str]) -> str:
    """The part of every key that is not the object's path in the channel directory.

    SageMaker keeps the structure *below* the prefix: ``s3://b/cifar/train`` with key
    ``cifar/train/a.tfrecords`` gives ``a.tfrecords``; a partial name
    (``s3://b/data/part``, key ``data/part-0``) keeps the name (``part-0``).
    """
    if not prefix or prefix.endswith("/"):
        return prefix
    if keys and all(k.startswith(prefix + "/") for k in keys):
        return prefix + "/"
    return prefix[: prefix.rfind("/") + 1]
