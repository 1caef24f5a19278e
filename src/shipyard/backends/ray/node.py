"""An instance's files on its Ray node, and the tar helpers that carry them (no Ray import).

No filesystem is assumed to be shared with the submitting machine. Everything an
instance needs arrives as bytes through Ray's object store and is unpacked under the
node's work dir (``$SHIPYARD_RAY_WORKDIR`` in the node's environment, default
``<tmp>/shipyard-ray``)::

    <workdir>/<job>/instances/algo-k/     the /opt/ml tree the agent builds (SM_* paths)
    <workdir>/<job>/stage/algo-k/         agent.json (0600), agent.log, source/, channels/,
                                          pythonpath/
    <workdir>/<job>/shared/model/         TensorFlow's default --model_dir on this node

When the instance ends, model/, output/ and agent/ of its tree (and shared/) go back to
the submitting machine as one tar and the node's copy is deleted; the job's directory
goes when its last instance on the node has gone (a lock file orders co-located
instances).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass

from shipyard import settings
from shipyard.backends.resources import RESOURCES_NAME

RESULT_PARTS = ("model", "output", "agent")


def workdir() -> str:
    return settings.get("SHIPYARD_RAY_WORKDIR") or os.path.join(
        tempfile.gettempdir(), "shipyard-ray"
    )


# -- tar helpers (both sides) ---------------------------------------------------------------
def pack(entries: list[tuple[str, str]], compress: bool = False) -> bytes:
    """``[(path, arcname), ...]`` -> tar bytes; missing paths are skipped, links followed."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w", dereference=True) as tar:
        for path, arcname in entries:
            if os.path.lexists(path):
                tar.add(path, arcname=arcname)
    return buf.getvalue()


def pack_contents(path: str) -> bytes:
    """A directory's contents (or a single file) as tar bytes, names relative to it."""
    if os.path.isdir(path):
        return pack([(os.path.join(path, name), name) for name in sorted(os.listdir(path))])
    return pack([(path, os.path.basename(path))])


def unpack(data: bytes, dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        tar.extractall(dest, filter="data")


# -- the node-side layout -----------------------------------------------------------------
@dataclass(frozen=True)
class NodeLayout:
    root: str  # <workdir>/<job>
    host: str

    @classmethod
    def for_instance(cls, job_name: str, host: str) -> NodeLayout:
        return cls(os.path.join(workdir(), job_name), host)

    @property
    def instances_dir(self) -> str:
        return os.path.join(self.root, "instances")

    @property
    def tree(self) -> str:
        return os.path.join(self.instances_dir, self.host)

    @property
    def stage(self) -> str:
        return os.path.join(self.root, "stage", self.host)

    @property
    def shared(self) -> str:
        return os.path.join(self.root, "shared")

    @property
    def config_path(self) -> str:
        return os.path.join(self.stage, "agent.json")

    @property
    def log_path(self) -> str:
        return os.path.join(self.stage, "agent.log")

    def fresh(self) -> None:
        """Start an attempt from nothing (an earlier attempt may have run here)."""
        for path in (self.tree, self.stage):
            shutil.rmtree(path, ignore_errors=True)
        os.makedirs(self.stage)

    def cleanup(self) -> None:
        """Delete this instance's files; the job's dir too when no other instance is left."""
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for path in (self.tree, self.stage):
                shutil.rmtree(path, ignore_errors=True)
            others = [
                d
                for base in (self.instances_dir, os.path.dirname(self.stage))
                if os.path.isdir(base)
                for d in os.listdir(base)
            ]
            if not others:
                shutil.rmtree(self.root, ignore_errors=True)

    def results(self) -> bytes:
        """model/, output/, agent/ of the tree and shared/, for the submitting machine, and
        what the instance got of its node (resources.json, written by the keeper's launch:
        backends.resources)."""
        entries = [(os.path.join(self.tree, part), part) for part in RESULT_PARTS]
        entries.append((self.shared, "shared"))
        entries.append((os.path.join(self.stage, RESOURCES_NAME), RESOURCES_NAME))
        return pack(entries, compress=True)


def localize(config: dict, layout: NodeLayout, blobs: dict[str, bytes]) -> dict:
    """Unpack the job's blobs on this node and point the agent config at them."""
    config = dict(config)
    source = os.path.join(layout.stage, "source", "sourcedir.tar.gz")
    os.makedirs(os.path.dirname(source))
    with open(source, "wb") as fh:
        fh.write(blobs["bundle"])
    config["submit_directory"] = source
    channels = {}
    for name, value in config["channel_sources"].items():
        if f"channel:{name}" in blobs:
            value = os.path.join(layout.stage, "channels", name)
            unpack(blobs[f"channel:{name}"], value)
        channels[name] = value
    config["channel_sources"] = channels
    python_path = []
    for i, _ in enumerate(config.get("extra_python_path") or []):
        path = os.path.join(layout.stage, "pythonpath", str(i))
        unpack(blobs[f"pythonpath:{i}"], path)
        python_path.append(path)
    config["extra_python_path"] = python_path
    old_shared = config.get("shared_dir")
    if old_shared:
        model_dir = json.dumps(os.path.join(old_shared, "model"))
        hps = dict(config["hyperparameters"])
        if hps.get("model_dir") == model_dir:
            hps["model_dir"] = json.dumps(os.path.join(layout.shared, "model"))
        config["hyperparameters"] = hps
        config["shared_dir"] = layout.shared
        os.makedirs(os.path.join(layout.shared, "model"), exist_ok=True)
    config["instances_dir"] = layout.instances_dir
    return config


def write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def interface_of(ip: str, default: str) -> str:
    """The network interface holding ``ip`` on this node (SM_NETWORK_INTERFACE_NAME)."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == ip for a in addrs):
                return name
    except Exception:  # noqa: BLE001, S110 - informational only
        pass
    if ip.startswith("127."):
        return "lo"
    return default


def merge_resources(job: dict | None, node: dict, host: str, node_ip: str) -> dict:
    """The job's resources.json (describe's ``Shipyard.Resources``) with one more Ray
    instance's record from its node. Each node limits its own instances (its cgroups, the
    GPUs Ray granted), so every instance says which node it ran on, and a node whose
    limits differ from the first one's says so in the notes."""
    mine = dict(node.get("Instances", {}).get(host) or {}, Node=node_ip)
    if job is None:
        job = {k: v for k, v in node.items() if k != "Instances"}
        job["Instances"] = {}
        job["Notes"] = list(node.get("Notes") or [])
    elif node.get("Cgroups") != job.get("Cgroups"):
        job["Notes"] = list(job.get("Notes") or []) + [
            f"{host} (node {node_ip}): "
            + (
                f"cgroup {node['Cgroups']}"
                if node.get("Cgroups")
                else f"no limits: {node.get('Unlimited')}"
            )
        ]
    job["Instances"] = dict(job.get("Instances") or {}, **{host: mine})
    return job
