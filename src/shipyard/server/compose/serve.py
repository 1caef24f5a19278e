"""A local-mode hosting project run as a shipyard endpoint, in the foreground.

The SDK mounts the unpacked model at ``/opt/ml/model`` (and the code directory at
``/opt/ml/code`` when it is local), publishes the container's port 8080 on the host, waits for
``GET /ping`` on ``localhost``, sends ``/invocations`` there, and ends the endpoint by
terminating ``docker compose up``. So: start a shipyard endpoint on that port, print its log
to stdout while it serves, delete it when terminated.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from typing import Any

from shipyard.errors import ShipyardError
from shipyard.server.compose.project import Project
from shipyard.server.compose.train import _framework, fetch_code

CONTAINER_PORT = 8080
STOP_GRACE_S = 2.0


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


def endpoint_args(project: Project, scratch: str) -> dict[str, Any]:
    """What ``Endpoints.create`` needs, from the serving container's description."""
    svc = project.first
    framework, _version, _py = _framework(svc.image, "inference")
    env = svc.environment
    model = svc.host_dir("/opt/ml/model")
    if not model:
        raise ShipyardError("the serving container mounts no model at /opt/ml/model")
    port = next((host for host, inner in svc.ports if inner == CONTAINER_PORT), CONTAINER_PORT)
    program = env.get("SAGEMAKER_PROGRAM") or None
    source = fetch_code(env.get("SAGEMAKER_SUBMIT_DIRECTORY"), svc, scratch) if program else None
    return {
        "model_data": model,
        "framework": framework,
        "entry_point": program,
        "source_dir": source,
        "port": port,
    }


def run(project: Project, compose_file: str) -> int:
    """Serve until SIGTERM or SIGINT; 0 then, 1 when the endpoint could not start or died."""
    from shipyard.control.endpoints import Endpoints, EndpointStatus

    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    scratch = tempfile.mkdtemp(prefix="shipyard-local-", dir=os.path.dirname(compose_file))
    eps = Endpoints()
    name = f"local-{project.first.name}"[:63]
    try:
        args = endpoint_args(project, scratch)
        model = args.pop("model_data")
        eps.create(name, model, **args)
        record = eps.wait(name)
        print(f"shipyard: endpoint {name} InService at {record.url}", flush=True)
        with open(record.log_path, "rb") as log:
            while True:
                chunk = log.read()
                if chunk:
                    os.write(1, chunk)
                current = eps.get(name)
                if current.status is not EndpointStatus.IN_SERVICE:
                    # the SDK's `down` terminates this process's children first, then this
                    # process: give its SIGTERM the moment to arrive before calling it a failure
                    time.sleep(STOP_GRACE_S)
                    print(
                        f"shipyard: endpoint {name} stopped: {current.failure_reason}", flush=True
                    )
                    return 1
                time.sleep(0.5)
    except _Stop:
        return 0
    except ShipyardError as exc:
        print(f"shipyard: {exc}", flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.path.exists(eps.endpoint_dir(name)):
            eps.delete(name)
        shutil.rmtree(scratch, ignore_errors=True)
