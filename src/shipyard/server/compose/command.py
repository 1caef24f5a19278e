"""The ``docker`` and ``docker-compose`` command lines, as far as the SageMaker SDK's local
mode uses them (``sagemaker/local/image.py`` and ``local/utils.py``):

- ``docker compose version`` (it wants a "v2" in the answer) and ``docker-compose``;
- ``docker compose -f FILE up --build --abort-on-container-exit``: train or serve, in the
  foreground, output on stdout (the SDK reads only stdout; when serving it never reads
  stderr, so stderr is sent to stdout lest a full pipe block the server);
- ``docker images -q IMAGE`` (so the SDK neither logs in to ECR nor pulls), ``docker pull``,
  ``docker login``;
- ``docker info`` and ``docker context inspect``: fail, so the SDK talks to ``localhost``.

Anything else fails with a message saying that this is shipyard's stand-in and not Docker.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence

from shipyard import settings
from shipyard.server.compose.project import ComposeError, load

VERSION = "Docker Compose version v2.29.7 (shipyard: SageMaker local mode without Docker)"
NOT_DOCKER = "shipyard's docker stand-in (SageMaker local mode without Docker)"


def _err(message: str) -> int:
    print(f"{NOT_DOCKER}: {message}", file=sys.stderr, flush=True)
    return 1


def compose(args: Sequence[str]) -> int:
    files: list[str] = []
    rest: list[str] = []
    items = list(args)
    while items:
        arg = items.pop(0)
        if arg in ("-f", "--file") and items:
            files.append(items.pop(0))
        elif arg.startswith("--file="):
            files.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    if not rest or rest[0] in ("version", "--version", "-v"):
        print(VERSION, flush=True)
        return 0
    verb = rest[0]
    if verb == "down":
        return 0  # `up` ran in the foreground and removed what it made when it ended
    if verb != "up":
        return _err(f"`docker compose {verb}` is not something SageMaker local mode runs")
    if "--detach" in rest or "-d" in rest:
        return _err("`up --detach` is not supported; the SDK runs `up` in the foreground")
    if len(files) != 1:
        return _err("give exactly one compose file with -f (as the SageMaker SDK does)")
    os.dup2(1, 2)  # the SDK reads stdout only (and, when serving, never drains stderr)
    if settings.get("SHIPYARD_PROGRESS") is None:  # plain lines: the SDK prints them as they come
        os.environ["SHIPYARD_PROGRESS"] = "plain"
    try:
        project = load(files[0])
    except ComposeError as exc:
        print(f"shipyard: {exc}", flush=True)
        return 1
    if project.command == "train":
        from shipyard.server.compose import train

        return train.run(project, files[0])
    from shipyard.server.compose import serve

    return serve.run(project, files[0])


def docker(args: Sequence[str]) -> int:
    if not args or args[0] in ("--version", "version"):
        print("Docker version 28.0.0 (shipyard: SageMaker local mode without Docker)")
        return 0
    verb, rest = args[0], list(args[1:])
    if verb == "compose":
        return compose(rest)
    if verb == "images":
        image = next((a for a in rest if not a.startswith("-")), "")
        # an id, so the SDK takes the image as present: shipyard runs the framework installed
        # here, and refuses at `up`, naming the image, what it cannot run
        print(hashlib.sha256(image.encode()).hexdigest()[:12])
        return 0
    if verb == "pull":
        print(f"shipyard runs this image's framework on this machine; nothing to pull: {rest}")
        return 0
    if verb == "login":
        sys.stdin.read()
        print("Login Succeeded")
        return 0
    if verb in ("info", "context"):
        return _err("there is no Docker daemon; local endpoints answer on localhost")
    return _err(f"`docker {verb}` is not something SageMaker local mode runs")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shipyard.server.compose docker ARGS`` or ``... docker-compose ARGS``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("docker", "docker-compose"):
        return _err("usage: python -m shipyard.server.compose docker|docker-compose ARGS")
    return docker(args[1:]) if args[0] == "docker" else compose(args[1:])
