"""The actor that is one instance on its Ray node (node side; made remote in ray.py).

Its methods never block for long, so a single-threaded actor serves them all: ``start``
unpacks what the object store brought and starts the keeper (which starts the agent);
``tick`` hands back the log bytes written since the last tick and, once the agent has
ended, its exit status; ``stop`` asks the keeper to stop the agent; ``finish`` returns
model/, output/, agent/ and shared/ as one tar and deletes the instance's files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from shipyard.backends.ray.node import NodeLayout, interface_of, localize, write_private
from shipyard.environments.node import on_node as framework_env_on_node
from shipyard.runtime.lifeline import die_with_parent

# Environment a Ray worker carries that must not reach the job's processes: Ray's own
# worker variables, and the OMP_NUM_THREADS=<actor CPUs> Ray injects.
_DROP_PREFIXES = ("RAY_",)
_DROP = {"OMP_NUM_THREADS"}
_KEEP = {"RAY_ADDRESS"}


def node_env(forwarded: dict[str, str]) -> dict[str, str]:
    """The node's environment (minus the Ray worker's own) plus what the submitter sends."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k in _KEEP or not (k in _DROP or k.startswith(_DROP_PREFIXES))
    }
    env.update(forwarded)
    return env


def node_sandbox(asked: dict, ip: str) -> dict:
    """The instance's sandbox on this node: mount + UTS namespaces (/opt/ml, algo-k,
    /etc/hosts with the nodes' addresses) where this node's kernel allows them, decided
    here since nodes may differ; the reason in the agent's log where it does not. Its
    processes' wildcard listeners bind ``ip``, the node's cluster address (the bind shim,
    shipyard.sandbox.bindshim; it needs no namespace)."""
    if not asked.get("on_node"):
        return asked
    from shipyard.sandbox import probe

    support = probe.support(network=False)
    return {
        "enabled": False,
        "mounts": support.ok,
        "rootless": support.rootless,
        "reason": support.reason,
        "bind_address": ip,
    }


class InstanceActor:
    def __init__(self, job_name: str, host: str) -> None:
        self.layout = NodeLayout.for_instance(job_name, host)
        self.job_name = job_name
        self.host = host
        self.proc: subprocess.Popen | None = None
        self.code: int | None = None
        self.offset = 0
        self._started = threading.Event()

    def start(self, config: dict, blobs: dict, env: dict[str, str], grace: float) -> dict:
        import ray

        self.layout.fresh()
        data = {name: ray.get(ref) for name, ref in blobs.items()}
        config = localize(config, self.layout, data)
        # the job's framework environment, built or found on this node (issue 28)
        config = framework_env_on_node(config, env)
        ip = ray.util.get_node_ip_address()
        config["network_interface_name"] = interface_of(ip, config["network_interface_name"])
        config["sandbox"] = node_sandbox(config.get("sandbox") or {}, ip)
        write_private(self.layout.config_path, json.dumps(config, indent=1, sort_keys=True))
        open(self.layout.log_path, "wb").close()
        argv = [
            sys.executable,
            "-m",
            "shipyard.backends.ray.keeper",
            "--job",
            self.job_name,
            "--host",
            self.host,
            "--grace",
            str(grace),
        ]
        # A thread of our own forks the keeper and waits for it: PDEATHSIG fires when the
        # forking *thread* ends, so it must live exactly as long as the keeper. The keeper
        # gets a session of its own: Ray SIGKILLs a dead worker's process group, and the
        # keeper must survive that to stop the agent and delete the files.
        threading.Thread(target=self._run, args=(argv, node_env(env)), daemon=True).start()
        self._started.wait()
        return {
            "pid": self.proc.pid if self.proc else None,
            "ip": ip,
            "node_id": ray.get_runtime_context().get_node_id(),
            "base": self.layout.tree,
        }

    def _run(self, argv: list[str], env: dict[str, str]) -> None:
        try:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # noqa: PLW1509
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            self.code = 127
            return
        finally:
            self._started.set()
        self.code = self.proc.wait()

    def tick(self) -> tuple[bytes, int | None]:
        code = self.code  # read first: once set, the log below is complete
        try:
            with open(self.layout.log_path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(8 << 20)
        except OSError:
            data = b""
        self.offset += len(data)
        if code is not None and len(data) == 8 << 20:
            code = None  # more to send first
        return data, code

    def stop(self) -> None:
        if self.proc is not None and self.code is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def finish(self) -> bytes:
        try:
            return self.layout.results()
        finally:
            self.layout.cleanup()
