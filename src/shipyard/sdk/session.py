"""Session: which shipyard home and backend an estimator talks to.

``Session()`` uses SHIPYARD_HOME (default ~/.shipyard) and SHIPYARD_BACKEND (default
``local``), mirroring how a SageMaker session carries the region and client.
``Session(backend='ray', address=...)`` runs jobs on a Ray cluster: the address is
``host:port``, ``ray://host:port`` or ``auto`` (default: SHIPYARD_RAY_ADDRESS, then
RAY_ADDRESS, then ``auto``); see shipyard.backends.ray.
"""

from __future__ import annotations

import os

from shipyard import settings
from shipyard.control.client import ControlPlane
from shipyard.errors import ValidationError

BACKENDS = ("local", "ray")
# the account and role `shipyard server` answers for (names only: jobs run as the user)
LOCAL_ACCOUNT = "000000000000"
EXECUTION_ROLE = f"arn:aws:iam::{LOCAL_ACCOUNT}:role/ShipyardExecutionRole"


class Session:
    """Where jobs and endpoints go (``sagemaker.Session``): a shipyard home (its job store,
    artifacts and endpoints) and a backend (this machine, or a Ray cluster)."""

    def __init__(
        self, backend: str | None = None, home: str | None = None, address: str | None = None
    ) -> None:
        """Open a session; nothing starts.

        Args:
            backend: ``'local'`` (instances on this machine) or ``'ray'`` (a Ray cluster);
                default ``SHIPYARD_BACKEND``, else ``'local'``.
            home: The shipyard home directory; default ``SHIPYARD_HOME`` (``~/.shipyard``).
            address: The Ray cluster (``host:port``, ``ray://host:port`` or ``auto``);
                ``backend='ray'`` only. Default ``SHIPYARD_RAY_ADDRESS``, then
                ``RAY_ADDRESS``, then ``auto``.
        """
        self.backend = backend or settings.text("SHIPYARD_BACKEND")
        if self.backend not in BACKENDS:
            raise ValidationError(
                f"unknown backend {self.backend!r}; available: "
                + ", ".join(repr(b) for b in BACKENDS)
            )
        self.address = address
        name = self.backend
        if self.backend == "ray":
            from shipyard.backends.ray.connect import require_ray, resolve_address

            require_ray()
            self.address = resolve_address(address)
            name = f"ray@{self.address}"
        elif address is not None:
            raise ValidationError("address= is for backend='ray'; the local backend has none")
        self.control = ControlPlane(home=home, backend=name)

    @property
    def home(self) -> str:
        """The session's shipyard home directory."""
        return self.control.home.root

    def default_output_path(self) -> str:
        """Where a job's artifacts go when its estimator names no ``output_path``."""
        return self.control.home.default_output_path

    # -- the SageMaker notebook helpers -----------------------------------------------------
    @property
    def boto_region_name(self) -> str:
        """``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else ``us-east-1`` (names only)."""
        return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    def default_bucket(self) -> str:
        """SageMaker's name, ``sagemaker-<region>-<account>``: on the S3 endpoint when one
        is configured (created if missing), else a directory under SHIPYARD_HOME/s3."""
        name = f"sagemaker-{self.boto_region_name}-{LOCAL_ACCOUNT}"
        from shipyard import storage

        if storage.endpoint_url():
            from shipyard.storage.s3 import client

            s3 = client()
            try:
                s3.head_bucket(Bucket=name)
            except Exception:  # noqa: BLE001 - any refusal: try to create, which says why
                s3.create_bucket(Bucket=name)
        return name

    def upload_data(self, path: str, bucket: str | None = None, key_prefix: str = "data") -> str:
        """Upload a file or directory as ``sagemaker.Session.upload_data`` does; returns its
        s3:// URI (an S3 endpoint is configured) or file:// URI (local store).

        Args:
            path: The local file or directory.
            bucket: The bucket; default ``default_bucket()``.
            key_prefix: The key prefix the files go under.
        """
        from shipyard import storage

        if not os.path.exists(path):
            raise ValidationError(f"upload_data: {path!r} does not exist")
        bucket = bucket or self.default_bucket()
        key_prefix = key_prefix.strip("/")
        if storage.endpoint_url():
            base = storage.parse(f"s3://{bucket}/{key_prefix}")
        else:
            root = os.path.join(self.home, "s3-local", bucket)
            base = storage.parse("file://" + os.path.join(root, key_prefix))
        files = (
            [
                (os.path.join(d, f), os.path.relpath(os.path.join(d, f), path))
                for d, _, fs in os.walk(path)
                for f in fs
            ]
            if os.path.isdir(path)
            else [(path, os.path.basename(path))]
        )
        for local, rel in files:
            target = base.child(rel.replace(os.sep, "/"))
            storage.store_for(target).upload(local, target)
        return base.uri if os.path.isdir(path) else base.child(files[0][1]).uri


def get_execution_role(sagemaker_session: Session | None = None) -> str:
    """The execution role ARN a SageMaker notebook asks for; with shipyard it is only a name
    (jobs run as the user) -- the same one ``shipyard server`` answers for.

    Args:
        sagemaker_session: SageMaker's argument; accepted.
    """
    return EXECUTION_ROLE


# SageMaker's local-mode session: on shipyard every session is local (or Ray)
LocalSession = Session
