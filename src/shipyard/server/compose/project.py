"""The compose file the SageMaker SDK's local mode writes, read into what shipyard needs.

Pure: a parsed file in, a :class:`Project` out (or a :class:`ComposeError` naming what cannot
be mapped). The SDK writes one service per container (``algo-1-xxxxx``...), each with the same
image, environment and command, and volumes ``HOST_DIR:CONTAINER_DIR`` (``/opt/ml/input``,
``/opt/ml/model``, ``/opt/ml/code``, ``/opt/ml/input/data/<channel>``...), see
``sagemaker/local/image.py`` (``_generate_compose_file``, ``_create_docker_host``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shipyard.errors import ShipyardError

CHANNEL_PREFIX = "/opt/ml/input/data/"
COMMANDS = ("train", "serve")


class ComposeError(ShipyardError):
    """The compose file asks for something shipyard's local mode cannot map."""


@dataclass
class Service:
    """One container of the compose file: an instance (train) or the endpoint (serve)."""

    name: str
    image: str
    command: str
    volumes: dict[str, str]  # container dir -> host dir
    environment: dict[str, str]
    ports: list[tuple[int, int]] = field(default_factory=list)  # (host, container)
    gpu: bool = False

    def host_dir(self, container_dir: str) -> str | None:
        return self.volumes.get(container_dir.rstrip("/"))

    def host_path(self, container_path: str) -> str | None:
        """Where a path inside the container lies on the host, through the deepest volume
        holding it (``/opt/ml/model/code`` lies in the ``/opt/ml/model`` volume)."""
        path = container_path.rstrip("/")
        for mount in sorted(self.volumes, key=len, reverse=True):
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return self.volumes[mount] + path[len(mount) :]
        return None

    @property
    def channels(self) -> dict[str, str]:
        """Channel name -> host directory, from the ``/opt/ml/input/data/<name>`` volumes."""
        return {
            c[len(CHANNEL_PREFIX) :]: host
            for c, host in self.volumes.items()
            if c.startswith(CHANNEL_PREFIX) and "/" not in c[len(CHANNEL_PREFIX) :]
        }


@dataclass
class Project:
    services: list[Service]

    @property
    def command(self) -> str:
        return self.services[0].command

    @property
    def first(self) -> Service:
        return self.services[0]


def _host_order(name: str) -> tuple[int, str]:
    """``algo-2-ab3cd`` sorts after ``algo-1-...`` and before ``algo-10-...``."""
    found = re.match(r"^algo-(\d+)", name)
    return (int(found[1]) if found else 0, name)


def _volumes(name: str, raw: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw or []:
        if not isinstance(item, str):
            raise ComposeError(f"service {name}: volume {item!r} is not HOST:CONTAINER")
        text = item[:-2] if item.endswith(":z") else item
        host, sep, container = text.rpartition(":")
        if not sep or not host or not container.startswith("/"):
            raise ComposeError(f"service {name}: volume {item!r} is not HOST:CONTAINER")
        out[container.rstrip("/") or "/"] = host
    return out


def _environment(name: str, raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): "" if v is None else str(v) for k, v in raw.items()}
    out: dict[str, str] = {}
    for item in raw or []:
        key, sep, value = str(item).partition("=")
        if not sep:
            raise ComposeError(f"service {name}: environment entry {item!r} is not KEY=VALUE")
        out[key] = value
    return out


def _ports(name: str, raw: Any) -> list[tuple[int, int]]:
    out = []
    for item in raw or []:
        host, _, container = str(item).rpartition(":")
        try:
            out.append((int(host or container), int(container)))
        except ValueError:
            raise ComposeError(
                f"service {name}: port mapping {item!r} is not HOST:CONTAINER"
            ) from None
    return out


def _gpu(config: dict[str, Any]) -> bool:
    devices = (((config.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []
    return any("gpu" in (d.get("capabilities") or []) for d in devices if isinstance(d, dict))


def service(name: str, config: dict[str, Any]) -> Service:
    if config.get("entrypoint"):
        raise ComposeError(
            f"service {name} sets a container entrypoint ({config['entrypoint']!r}): processing "
            "jobs, remote functions and pipeline steps are not run by shipyard's local mode; "
            "training (`train`) and hosting (`serve`) are"
        )
    command = config.get("command")
    if isinstance(command, list):
        command = " ".join(map(str, command))
    if command not in COMMANDS:
        raise ComposeError(
            f"service {name} runs {command!r}: shipyard's local mode maps SageMaker's `train` "
            "and `serve` commands only"
        )
    image = config.get("image")
    if not isinstance(image, str) or not image:
        raise ComposeError(f"service {name} names no image")
    return Service(
        name=name,
        image=image,
        command=command,
        volumes=_volumes(name, config.get("volumes")),
        environment=_environment(name, config.get("environment")),
        ports=_ports(name, config.get("ports")),
        gpu=_gpu(config),
    )


def project(data: Any) -> Project:
    """The :class:`Project` of a compose file's parsed content."""
    services = (data or {}).get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict) or not services:
        raise ComposeError("the compose file defines no services")
    parsed = [
        service(str(n), c or {})
        for n, c in sorted(services.items(), key=lambda i: _host_order(str(i[0])))
    ]
    if len({s.command for s in parsed}) != 1 or len({s.image for s in parsed}) != 1:
        raise ComposeError("the compose file mixes images or commands between its services")
    if parsed[0].command == "serve" and len(parsed) != 1:
        raise ComposeError("a local endpoint runs in one container; this file defines several")
    return Project(parsed)


def load(path: str) -> Project:
    try:
        import yaml
    except ImportError:  # the SDK that writes these files depends on PyYAML itself
        raise ComposeError("reading a compose file needs PyYAML (pip install pyyaml)") from None
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ComposeError(f"cannot read the compose file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ComposeError(f"the compose file {path} is not YAML: {exc}") from None
    return project(data)
