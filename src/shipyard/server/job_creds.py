"""How a job gets its own credential: SageMaker's container credentials, served here.

On SageMaker a training container finds its execution role's temporary credentials
through the container credentials provider every AWS SDK implements, not in its
environment. A job created through ``shipyard server`` gets the same:
``AWS_CONTAINER_CREDENTIALS_FULL_URI`` (this server's ``/_shipyard/credentials``, reached
through the instance's forward to the server's port) and ``AWS_CONTAINER_AUTHORIZATION_TOKEN``
(its grant's session token); boto3 fetches the job's key, secret and session token from
there and refreshes them before they expire. The job's environment holds no secret key
and never the server's. A server bound to an address that is not loopback cannot be a
container credentials URL over http (botocore refuses it), so there the job's key is
given as ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` instead.
Either way the key is the job's alone (``job_keys``), scoped (``job_policy``) and revoked
when the job ends.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import urllib.parse
from collections.abc import Iterable
from typing import Any

from shipyard.server.guard import Names, check_host
from shipyard.server.http import Request, Response, json_response
from shipyard.server.identity import ROLE_ARN
from shipyard.server.job_keys import JobGrant, KeyTable

CREDENTIALS_PATH = "/_shipyard/credentials"
LIFETIME = dt.timedelta(hours=1)  # boto3 fetches again 15 minutes before this


def container_credentials(req: Request, keys: KeyTable, names: Names) -> Response:
    """``GET /_shipyard/credentials`` with the job's token as ``Authorization``: its key."""
    check_host(req.headers, names, "sts")
    if req.method != "GET":
        return json_response({"code": "MethodNotAllowed", "message": "GET only"}, 405)
    token = req.headers.get("authorization", "")
    grant = keys.by_token(token) if token else None
    if grant is None or grant.revoked:
        why = grant.revoked if grant is not None else "the token is not a live job's"
        return json_response({"code": "AccessDenied", "message": f"no credentials: {why}"}, 403)
    expires = dt.datetime.now(dt.timezone.utc) + LIFETIME
    return json_response(
        {
            "AccessKeyId": grant.access_key,
            "SecretAccessKey": grant.secret_key,
            "Token": grant.session_token,
            "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "RoleArn": ROLE_ARN,
        }
    )


def job_environment(grant: JobGrant, url: str, region: str) -> dict[str, str]:
    """What a job's processes get to reach this server as themselves."""
    env = {
        "AWS_ENDPOINT_URL": url,
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    host = urllib.parse.urlsplit(url).hostname or ""
    if _loopback(host):
        env["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = url.rstrip("/") + CREDENTIALS_PATH
        env["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = grant.session_token
    else:
        env["AWS_ACCESS_KEY_ID"] = grant.access_key
        env["AWS_SECRET_ACCESS_KEY"] = grant.secret_key
        env["AWS_SESSION_TOKEN"] = grant.session_token
    return env


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def grants_for(spec: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read, write) ``bucket/prefix`` strings of a JobSpec: its channels to read; its
    output (``<output_path>/<job>/``, as SageMaker lays it out), checkpoint and
    TensorBoard locations to read and write."""
    read = _prefixes(ch.uri for ch in spec.channels)
    write = []
    if spec.output_path:
        write += _prefixes([f"{spec.output_path.rstrip('/')}/{spec.job_name}/"])
    if spec.checkpoint_s3_uri:
        write += _prefixes([spec.checkpoint_s3_uri.rstrip("/") + "/"])
    if spec.tensorboard is not None:
        write += _prefixes([spec.tensorboard.output_uri(spec.job_name) + "/"])
    return tuple(read), tuple(write)


def _prefixes(uris: Iterable[str]) -> list[str]:
    return [u[len("s3://") :] for u in uris if u and u.startswith("s3://")]
