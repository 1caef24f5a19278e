"""STS GetCallerIdentity and IAM GetRole: a local account and one execution role.

``sagemaker.get_execution_role()`` takes the caller's assumed-role ARN from STS, turns
it into a role ARN and asks IAM for the role; ``Session().default_bucket()`` takes the
account id from STS. Both answer for ``ACCOUNT`` and the role ``ROLE_NAME``, which are
only names here: shipyard runs jobs as the user who started the server.
"""

from __future__ import annotations

import datetime as dt

from shipyard.server.errors import ApiError
from shipyard.server.http import Request, Response, tag, xml_response

ACCOUNT = "000000000000"
ROLE_NAME = "ShipyardExecutionRole"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/{ROLE_NAME}"
CALLER_ARN = f"arn:aws:sts::{ACCOUNT}:assumed-role/{ROLE_NAME}/shipyard"
STS_NS = "https://sts.amazonaws.com/doc/2011-06-15/"
IAM_NS = "https://iam.amazonaws.com/doc/2010-05-08/"
_META = "<ResponseMetadata><RequestId>shipyard</RequestId></ResponseMetadata>"


class StsApi:
    def handle(self, req: Request) -> Response:
        action = req.form().get("Action")
        if action != "GetCallerIdentity":
            raise ApiError(
                "InvalidAction", f"STS action {action!r} is not served (GetCallerIdentity is)"
            )
        inner = (
            tag("Arn", CALLER_ARN)
            + tag("UserId", "AROASHIPYARD:shipyard")
            + tag("Account", ACCOUNT)
        )
        return xml_response(
            "GetCallerIdentityResponse",
            f"<GetCallerIdentityResult>{inner}</GetCallerIdentityResult>{_META}",
            ns=STS_NS,
        )


class IamApi:
    def handle(self, req: Request) -> Response:
        form = req.form()
        action = form.get("Action")
        if action != "GetRole":
            raise ApiError("InvalidAction", f"IAM action {action!r} is not served (GetRole is)")
        name = form.get("RoleName", "")
        if name != ROLE_NAME:
            raise ApiError(
                "NoSuchEntity",
                f"the role {name!r} does not exist; this server has one role, {ROLE_ARN}",
                404,
            )
        created = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        role = (
            tag("Path", "/")
            + tag("RoleName", ROLE_NAME)
            + tag("RoleId", "AROASHIPYARD")
            + tag("Arn", ROLE_ARN)
            + tag("CreateDate", created)
            + tag("MaxSessionDuration", 3600)
        )
        return xml_response(
            "GetRoleResponse",
            f"<GetRoleResult><Role>{role}</Role></GetRoleResult>{_META}",
            ns=IAM_NS,
        )
