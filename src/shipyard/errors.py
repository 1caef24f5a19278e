"""The typed error tree of shipyard, in one module (httpx style).

Every error a user can cause is a ``ShipyardError``; the message always says what
was wrong and what to do instead. Validation errors are also ``ValueError`` so code
written against the SageMaker SDK (which raises ``ValueError`` for bad arguments)
keeps catching them.

    ShipyardError
    ├── ValidationError (ValueError)      bad input, refused before anything starts
    │   ├── DistributionError             unknown / conflicting / not-yet-supported distribution
    │   ├── ChannelError                  an input channel that cannot be used
    │   ├── JobExistsError                a job of that name is already recorded
    │   ├── SettingError                  a SHIPYARD_* variable holds a value it does not accept
    │   └── AgentConfigError              an agent.json whose fields are missing or mistyped
    ├── StagingError                      code could not be staged (git clone, requirements, ...)
    ├── StorageError                      an s3:// or file:// location could not be read or written
    │   ├── StorageUnavailableError       the store did not answer (worth retrying)
    │   └── NoSpaceError                  a disk filled while shipyard wrote to it
    ├── JobNotFoundError (KeyError)       no such job in the store
    ├── BackendError                      instances could not be started or supervised
    ├── JobFailedError                    a waited-for job ended Failed (carries the FailureReason)
    ├── CorruptRecordError                a stored job record does not read back as a job
    ├── SchemaError                       the job store's database is of another version
    ├── EndpointError                     an endpoint could not be created, reached or deleted
    │   └── EndpointNotFoundError (KeyError)
    └── ModelError                        a model server answered an invocation with an error

Families that belong to one package keep their own module, rooted here:
``ps/errors.py`` (PSError: config, wire, remote, timeout, checkpoint), ``horovod/errors.py``
(HorovodError), ``serving/errors.py`` (ServingError), ``server/errors.py`` (ApiError: an
AWS error code and HTTP status), and the single errors of ``data/`` (TFRecordError,
RecordIOError, PipeModeDatasetException), ``mpi/command.py`` (MPIRunNotFoundError),
``observe/`` (StacksUnavailableError, NoTensorBoardOutputError), ``agent/channels/pipe.py``
(FeedError) and ``serving/transform/engine.py`` (TransformError).
``tests/unit/house/test_errors.py`` fails on an exception class that is not a ShipyardError.
"""

from __future__ import annotations


class ShipyardError(Exception):
    """Base of every error shipyard raises on purpose."""


class ValidationError(ShipyardError, ValueError):
    """Bad input: refused before anything was started or written."""


class DistributionError(ValidationError):
    """The ``distribution`` argument is unknown, ambiguous or not runnable yet."""


class ChannelError(ValidationError):
    """An input channel points at something that cannot be read."""


class StorageError(ShipyardError):
    """An object store location is missing, refuses the credentials or does not answer."""


class StorageUnavailableError(StorageError):
    """The store did not answer (connection refused or reset, a timeout, a 5xx): a state
    that passes (a restarted ``shipyard server``), so a caller with time retries."""


class NoSpaceError(StorageError):
    """A disk filled while shipyard wrote to it (ENOSPC or a quota); the message names the
    path, the size being written and the space left, in one line."""


class StagingError(ShipyardError):
    """The training code could not be staged (missing files, git clone, pip)."""


class JobExistsError(ValidationError):
    """A job with this name already exists; job names are unique like in SageMaker."""


class JobNotFoundError(ShipyardError, KeyError):
    """No job with this name in the store."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "job not found"


class BackendError(ShipyardError):
    """The backend could not start or supervise the job's instances."""


class JobFailedError(ShipyardError):
    """A job the caller waited for ended in ``Failed``; ``reason`` is its FailureReason."""

    def __init__(self, job_name: str, status: str, reason: str | None) -> None:
        self.job_name = job_name
        self.status = status
        self.reason = reason or ""
        super().__init__(f"Error for Training job {job_name}: {status}. Reason: {self.reason}")


class AgentConfigError(ValidationError):
    """An agent.json (shipyard.jobplan.config) whose fields are missing or mistyped; the
    message names the field."""


class SettingError(ValidationError):
    """A ``SHIPYARD_*`` variable holds a value its setting does not accept (or a required
    one is unset); the message names the variable and what it accepts."""


class CorruptRecordError(ShipyardError):
    """A stored job record does not read back as a valid job (another version wrote it,
    or the file was edited by hand)."""


class SchemaError(ShipyardError):
    """The database under SHIPYARD_HOME cannot be used by this version of shipyard."""


class EndpointError(ShipyardError):
    """An endpoint could not be created, reached or deleted."""


class EndpointNotFoundError(EndpointError, KeyError):
    """No endpoint of that name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "endpoint not found"


class ModelError(ShipyardError):
    """The model server answered with an error status (InvokeEndpoint's ModelError)."""

    def __init__(self, status: int, message: str, endpoint: str) -> None:
        self.status = status
        self.message = message
        super().__init__(
            f"An error occurred (ModelError) when calling the InvokeEndpoint "
            f"operation on {endpoint!r}: Received "
            f"{'client' if status < 500 else 'server'} error ({status}) with "
            f'message "{message}"'
        )
