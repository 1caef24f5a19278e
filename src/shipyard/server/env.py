"""What a notebook's environment needs to reach the server: ``shipyard server env``.

- ``AWS_ENDPOINT_URL`` points every boto3 client (sagemaker, sagemaker-runtime, logs, s3,
  iam) here; dummy keys and a region complete a botocore session.
- STS: ``get_execution_role()`` and ``default_bucket()`` create their STS client with an
  explicit ``endpoint_url=https://sts.<region>.amazonaws.com``
  (``sagemaker.utils.sts_regional_endpoint``), which beats ``AWS_ENDPOINT_URL``. botocore
  resolves every endpoint through the service's endpoint rule set, which it loads from
  ``AWS_DATA_PATH`` before its own data; ``aws_data`` writes an STS rule set there
  that resolves to this server whatever URL was given. Data, not code: no import hook,
  no patched SDK, and every other service keeps botocore's own rules.
- SigV4 for S3: a default boto3 client in us-east-1 presigns S3 URLs with SigV2, which
  the server refuses (as S3 does in every region opened since 2014). boto3 takes the
  signature version from the shared config file only, so ``AWS_CONFIG_FILE`` names one
  that says ``s3 = signature_version = s3v4`` (the profile is unset beside it).
- Telemetry: the SDK's config file (``SAGEMAKER_USER_CONFIG_OVERRIDE``) with
  ``TelemetryOptOut: true``, so nothing is sent to a public URL after ``fit()``.
- Local mode: ``PATH`` starts with a directory holding ``docker`` and ``docker-compose``
  stand-ins (``shipyard.server.compose``), so ``instance_type='local'`` runs on shipyard
  instances with no Docker on the machine. Only the printed shell lines carry it
  (``render``); the server's own environment keeps its PATH.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

from shipyard.server import credentials

DEFAULT_PORT = 8765
DEFAULT_REGION = "us-east-1"
STS_VERSION = "2011-06-15"
AWS_CONFIG = """\
# written by `shipyard server env`: S3 requests and presigned URLs signed with SigV4
[default]
s3 =
    signature_version = s3v4
"""
SAGEMAKER_CONFIG = """\
SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      TelemetryOptOut: true
"""


def client_dir(home: str) -> str:
    return os.path.join(home, "server", "client")


def sts_rule_set(url: str) -> dict:
    """An STS endpoint rule set whose one rule answers ``url``."""
    params = {
        "Region": {"builtIn": "AWS::Region", "required": False, "type": "String"},
        "UseDualStack": {
            "builtIn": "AWS::UseDualStack",
            "required": True,
            "default": False,
            "type": "Boolean",
        },
        "UseFIPS": {
            "builtIn": "AWS::UseFIPS",
            "required": True,
            "default": False,
            "type": "Boolean",
        },
        "Endpoint": {"builtIn": "SDK::Endpoint", "required": False, "type": "String"},
        "UseGlobalEndpoint": {
            "builtIn": "AWS::STS::UseGlobalEndpoint",
            "required": True,
            "default": False,
            "type": "Boolean",
        },
    }
    return {
        "version": "1.0",
        "parameters": params,
        "rules": [
            {
                "conditions": [],
                "endpoint": {"url": url, "properties": {}, "headers": {}},
                "type": "endpoint",
            }
        ],
    }


STAND_IN = """#!/bin/sh
# SageMaker local mode without Docker: written by `shipyard server env`
exec {python} -m shipyard.server.compose {command} "$@"
"""


def bin_dir(home: str) -> str:
    return os.path.join(client_dir(home), "bin")


def write_stand_ins(home: str, python: str = sys.executable) -> str:
    """``docker`` and ``docker-compose`` that run shipyard's local mode with this Python;
    returns their directory."""
    root = bin_dir(home)
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)  # private, as everything in the home
    for command in ("docker", "docker-compose"):
        path = os.path.join(root, command)
        _atomic(path, STAND_IN.format(python=shlex.quote(python), command=command))
        os.chmod(path, 0o700)
    return root


def write_client_files(home: str, url: str) -> dict[str, str]:
    """The STS rule set and the SDK config, under ``$SHIPYARD_HOME/server/client``."""
    root = client_dir(home)
    data = os.path.join(root, "aws-data")
    sts_dir = os.path.join(data, "sts", STS_VERSION)
    mask = os.umask(0o077)  # private like the rest of the home (`server env` makes them too)
    try:
        os.makedirs(sts_dir, exist_ok=True)
        _atomic(os.path.join(sts_dir, "endpoint-rule-set-1.json"), json.dumps(sts_rule_set(url)))
        config = os.path.join(root, "sagemaker-config.yaml")
        _atomic(config, SAGEMAKER_CONFIG)
        aws_config = os.path.join(root, "aws-config")
        _atomic(aws_config, AWS_CONFIG)
    finally:
        os.umask(mask)
    return {
        "AWS_DATA_PATH": data,
        "SAGEMAKER_USER_CONFIG_OVERRIDE": config,
        "AWS_CONFIG_FILE": aws_config,
    }


def _atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def variables(home: str, host: str, port: int, region: str | None = None) -> dict[str, str]:
    """Every variable a client needs, in the order ``server env`` prints them."""
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    access, secret = credentials.load(home)
    region = region or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    out = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
        "SHIPYARD_HOME": home,
    }
    out.update(write_client_files(home, url))
    return out


def render(values: dict[str, str], path_first: str | None = None) -> str:
    """The shell lines ``server env`` prints; ``path_first``, a directory put at the front
    of the shell's own PATH (the local-mode stand-ins)."""
    lines = ["unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL_STS AWS_ENDPOINT_URL_S3"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in values.items()]
    if path_first:
        lines.append(f'export PATH={shlex.quote(path_first)}:"$PATH"')
    return "\n".join(lines) + "\n"
