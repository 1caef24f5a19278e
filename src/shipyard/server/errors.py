"""Errors as AWS services send them, so botocore raises the exception class it would.

A missing training job, model, endpoint config, endpoint or transform job is a
ValidationException on SageMaker (``Requested resource not found.``, ``Could not find
endpoint ...``), not ResourceNotFound, and so it is here.

``ApiError`` carries the error code (``ValidationException``, ``ResourceInUse``, ...),
the HTTP status and a message that says what was wrong; each protocol module renders it
in its wire format (JSON for sagemaker/logs/sagemaker-runtime, XML for S3/STS/IAM).
"""

from __future__ import annotations

from shipyard.errors import ShipyardError


class ApiError(ShipyardError):
    """An error answered to the client, in the protocol of the service it called."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


def in_use(message: str) -> ApiError:
    return ApiError("ResourceInUse", message)


def limit_exceeded(message: str) -> ApiError:
    return ApiError("ResourceLimitExceeded", message)
