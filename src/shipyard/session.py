"""``shipyard.session`` (as ``sagemaker.session``): Session, s3_input (v1), the role."""

from shipyard.sdk.inputs import s3_input
from shipyard.sdk.session import LocalSession, Session, get_execution_role

__all__ = ["LocalSession", "Session", "get_execution_role", "s3_input"]
