"""Errors as AWS services send them, so botocore raises the exception class it would.

``ApiError`` carries the error code (``ValidationException``, ``ResourceNotFound``, ...),
the HTTP status and a message that says what was wrong; each protocol module renders it
in its wire format (JSON for sagemaker/logs/sagemaker-runtime, XML for S3/STS/IAM).
"""

from __future__ import annotations


class ApiError(Exception):
    """An error answered to the client, in the protocol of the service it called."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


def not_found(message: str) -> ApiError:
    """SageMaker's ResourceNotFound (Describe* of most resources answers ValidationException;
    see the callers)."""
    return ApiError("ResourceNotFound", message)


def in_use(message: str) -> ApiError:
    return ApiError("ResourceInUse", message)


def limit_exceeded(message: str) -> ApiError:
    return ApiError("ResourceLimitExceeded", message)
