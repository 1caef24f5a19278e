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
from dataclasses import replace

from shipyard.backends.ray.node import (
    NodeLayout,
    interface_of,
    localize,
    workdir,
    write_private,
)
from shipyard.environments.node import on_node as framework_env_on_node
from shipyard.jobplan import config_sandbox
from shipyard.jobplan.config_sandbox import SandboxPlan
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


def node_sandbox(asked: SandboxPlan, ip: str, hidden: tuple[str, ...] = ()) -> SandboxPlan:
    """The instance's sandbox on this node, decided here since nodes may differ: the local
    backend's (its own mount, UTS and PID namespaces, /opt/ml, algo-k, /etc/hosts with the
    nodes' addresses, no privileges, the filesystem view without ``hidden``) on the node's
    own network, where this node's kernel allows the namespaces; else the reason, which the
    agent logs. Its processes' wildcard listeners bind ``ip``, the node's cluster address
    (the bind shim, shipyard.sandbox.bindshim; it needs no namespace)."""
    if asked.mode != config_sandbox.PER_NODE:
        return asked
    from shipyard.sandbox import probe

    support = probe.support(network=False)
    return replace(
        asked,
        mode=config_sandbox.NODE_NETWORK if support.ok else config_sandbox.OFF,
        rootless=support.rootless,
        reason=support.reason,
        node_address=ip,
        hidden=tuple(hidden),
    )


def ray_gpus(instance_type: str, gpu_ids: list) -> dict[str, str]:
    """The GPUs the keeper's cgroup and ``CUDA_VISIBLE_DEVICES`` divide (backends.resources
    reads ``SHIPYARD_GPUS`` before nvidia-smi): for a GPU instance type exactly those Ray
    granted this actor, so two instances on one node never get the same GPU (dividing the
    node's own list, each would take the first ones). ``local``/``local_gpu`` keep seeing
    their node's GPUs, as on the local backend."""
    from shipyard.backends.ray.placement import demand

    want = demand(instance_type)
    if want.whole_node or not want.gpus:
        return {}
    return {"SHIPYARD_GPUS": ",".join(str(g) for g in gpu_ids) or "none"}


def hidden_on_node(submitted_instances_dir: str) -> tuple[str, ...]:
    """What a job's processes on this node must not see beyond the filesystem view's own
    (sandbox.fsview): the node's work dir (every job's instances here, with their
    agent.json and its secret; the job's own directory is bound back) and the submitter's
    ``$SHIPYARD_HOME`` (``<home>/jobs/<job>/instances`` there), which is on this machine
    when the node shares the submitter's. A path this node does not have is skipped."""
    jobs = os.path.dirname(os.path.dirname(os.path.abspath(submitted_instances_dir)))
    hidden = [workdir()]
    if os.path.basename(jobs) == "jobs":
        hidden.append(os.path.dirname(jobs))
    return tuple(hidden)


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
        submitted = config["instances_dir"]
        config = localize(config, self.layout, data)
        # the job's framework environment, built or found on this node (issue 28)
        config = framework_env_on_node(config, env)
        ip = ray.util.get_node_ip_address()
        config["network_interface_name"] = interface_of(ip, config["network_interface_name"])
        asked = SandboxPlan.from_dict(config.get("sandbox") or {})
        config["sandbox"] = node_sandbox(asked, ip, hidden_on_node(submitted)).to_dict()
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
        launch_env = node_env(env)
        launch_env.update(ray_gpus(config["instance_type"], ray.get_gpu_ids()))
        threading.Thread(target=self._run, args=(argv, launch_env), daemon=True).start()
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
