"""What a job's processes keep of the environment of the process that started them.

A job's environment is built from its spec (``environment``, the credential
``shipyard server`` minted for it) and what shipyard sets (``SM_*``, the runners'
variables), never copied whole from the server, the CLI or the notebook that submitted
it: that environment holds the server's signing key, the user's cloud credentials and
tokens, and a job's code is not to be trusted with them (issue 37). Only the essentials a
program needs to run as it would in a container are kept:

- the shell basics: ``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``TERM``, ``TZ``,
  ``LANG``, ``LANGUAGE``, ``LC_*``;
- where libraries and Python find their files: ``LD_LIBRARY_PATH``, ``PYTHONPATH``,
  ``PYTHONHASHSEED``, ``CUDA_*``/``NVIDIA_*`` (the instance's GPUs), threading knobs
  (``OMP_*``, ``MKL_*``, ``OPENBLAS_*``), ``NCCL_*``/``GLOO_*``, ``TF_*``, ``TORCH_*``;
- S3's address and region, which are not secrets: ``AWS_REGION``,
  ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``,
  ``AWS_EC2_METADATA_DISABLED``;
- shipyard's own settings (``SHIPYARD_*``) except where state and keys live:
  ``SHIPYARD_HOME`` and the server's key pair.

Keys (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, profiles,
credential files) are never inherited: a job that needs one gets it in its spec's
``environment``, or from ``shipyard server`` as its own.
"""

from __future__ import annotations

from collections.abc import Mapping

NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_EC2_METADATA_DISABLED",
    }
)
PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "NCCL_",
    "GLOO_",
    "TF_",
    "TORCH_",
    "SHIPYARD_",
)
NEVER = frozenset({"SHIPYARD_HOME", "SHIPYARD_SERVER_ACCESS_KEY", "SHIPYARD_SERVER_SECRET_KEY"})


def essentials(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` a job's processes inherit (see the module docstring)."""
    return {
        name: value
        for name, value in environ.items()
        if name not in NEVER and (name in NAMES or name.startswith(PREFIXES))
    }
