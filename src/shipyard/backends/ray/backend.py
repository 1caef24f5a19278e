"""The Ray backend: each instance is a Ray actor on a node of its own.

``launch`` reserves one placement-group bundle per instance (resources from the instance
type, see ray_placement), learns which node each bundle got, gives every instance its
address (the node's IP, or the job's loopback address when the cluster is one machine),
ships the code bundle, agent.json and local channel data through the object store, and
starts one InstanceActor per bundle; the actor runs the agent on its node as a
subprocess (under backends.ray.keeper), so the agent's process supervision works as on the local
backend. A monitor thread on the submitting machine then, for every instance:

* appends the node's new log bytes to the local log file (``logs/algo-k.log``), which
  the supervisor's LogTailer follows, so logs stream live with host prefixes;
* when the agent has ended, brings model/, output/ (success/failure), agent/ (lost
  processes, distribution report) and shared/ back into the job dir, deletes the node's
  copy, and only then reports the exit status (the supervisor reads those files);
* when the actor or its node dies, writes a failure reason naming the node.

The job store on the submitting machine stays the only source of truth; the actors are
owned by the supervisor's Ray driver, so if the supervisor dies Ray ends them and their
keepers stop the agents and delete the files.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from shipyard import settings
from shipyard.backends.api import InstanceHandle, LaunchSpec
from shipyard.backends.ray import node as ray_node
from shipyard.backends.ray import placement as ray_placement
from shipyard.backends.ray.connect import connect, resolve_address
from shipyard.errors import BackendError, ValidationError
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.layout import InstancePaths

STOP_MARGIN_S = 10.0
# What the submitting machine's environment passes on to the nodes (the rest is theirs).
FORWARD_PREFIXES = ("SHIPYARD_", "AWS_")
NOT_FORWARDED = {
    "SHIPYARD_HOME",
    "SHIPYARD_BACKEND",
    "SHIPYARD_RAY_ADDRESS",
    "SHIPYARD_RAY_WORKDIR",
}

_LAUNCH_NUMBERS = itertools.count(1)  # placement groups' names, one per launch


def forwarded_env(env: dict[str, str]) -> dict[str, str]:
    return {
        k: v for k, v in env.items() if k.startswith(FORWARD_PREFIXES) and k not in NOT_FORWARDED
    }


def node_launch_env(env: dict[str, str]) -> dict[str, str]:
    """What reaches the node's agent: the forwarded variables, and the mpi runner's
    launch mode: its mpirun starts prted on the other nodes through their instances
    (shipyard.mpi.rsh), since the nodes share neither ssh nor a disk."""
    return {**forwarded_env(env), "SHIPYARD_MPI_LAUNCH": "rsh"}


def cluster_nodes(ray: Any) -> list[ray_placement.NodeInfo]:
    return [
        ray_placement.NodeInfo(
            n["NodeID"],
            n["NodeManagerAddress"],
            float(n["Resources"].get("CPU", 0)),
            float(n["Resources"].get("GPU", 0)),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


@dataclass(eq=False)
class _Instance:
    host: str
    actor: Any
    log_path: str
    base: str  # the instance's tree on the submitting machine
    node_ip: str
    node_id: str
    pid: int | None = None
    code: int | None = None
    stopping: bool = False
    pending: Any = None


@dataclass(eq=False)
class _Launch:
    pg: Any
    instances: list[_Instance] = field(default_factory=list)
    thread: threading.Thread | None = None


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None = None) -> None:
        self.address = resolve_address(address)
        self._by_key: dict[tuple[str, str], _Instance] = {}

    # -- submission-time checks -------------------------------------------------------------
    def validate(self, instance_count: int, instance_type: str, runner: str) -> None:
        """Refuse what cannot run here before anything is written: a missing cluster,
        a cluster with fewer fitting machines than instances."""
        try:
            ray = connect(self.address)
        except BackendError as exc:  # the address the user gave reaches no cluster
            raise ValidationError(str(exc)) from None
        ray_placement.plan_placement(
            cluster_nodes(ray), instance_count, ray_placement.demand(instance_type), self.address
        )

    # -- launch ---------------------------------------------------------------------------
    def launch(self, specs: list[LaunchSpec]) -> list[InstanceHandle]:
        ray = connect(self.address)
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        config = AgentConfig.load(specs[0].config_path)
        hosts = [s.host for s in specs]
        want = ray_placement.demand(config.instance_type)
        nodes = {n.node_id: n for n in cluster_nodes(ray)}
        try:
            placement = ray_placement.plan_placement(
                list(nodes.values()), len(specs), want, self.address
            )
        except ValidationError as exc:
            raise BackendError(str(exc)) from None
        # a name per launch: Ray removes a placement group asynchronously, so a retry's
        # launch right after the failed attempt's teardown found the job's name still
        # taken ("name 'shipyard:ray-kill' already exists": the retry failed the job)
        pg = placement_group(
            placement.bundles,
            strategy=placement.strategy,
            name=f"shipyard:{config.job_name}:{next(_LAUNCH_NUMBERS)}",
        )
        launch = _Launch(pg)
        try:
            placement_timeout = settings.number("SHIPYARD_RAY_PLACEMENT_TIMEOUT")
            if not pg.wait(timeout_seconds=placement_timeout):
                raise BackendError(
                    f"Ray could not place {len(specs)} instance(s) of {want.instance_type!r} "
                    f"({want.describe()} each, strategy {placement.strategy}) within "
                    f"{placement_timeout:g} s: the nodes that fit are busy or went away "
                    "(SHIPYARD_RAY_PLACEMENT_TIMEOUT sets the wait)"
                )
            bundle_nodes = placement_group_table(pg)["bundles_to_node_id"]
            placed = [
                nodes.get(bundle_nodes[i]) or _unknown(bundle_nodes[i]) for i in range(len(specs))
            ]
            try:
                addresses = ray_placement.instance_addresses(
                    hosts, [n.ip for n in placed], config.addresses
                )
            except ValidationError as exc:
                raise BackendError(str(exc)) from None
            blobs = self._blobs(ray, config)
            actor_cls = ray.remote(_actor_class())
            starts = []
            grace = settings.number("SHIPYARD_STOP_GRACE")
            for i, (spec, node) in enumerate(zip(specs, placed)):
                actor = actor_cls.options(
                    num_cpus=want.cpus,
                    num_gpus=want.gpus,
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=i
                    ),
                ).remote(config.job_name, spec.host)
                node_config = dict(config.to_dict(), addresses=addresses)
                if want.whole_node:
                    node_config.update(
                        num_cpus=max(1, int(node.cpus)), num_gpus=int(node.gpus) if want.gpus else 0
                    )
                else:
                    node_config.update(num_cpus=int(want.cpus), num_gpus=int(want.gpus))
                inst = _Instance(
                    spec.host,
                    actor,
                    spec.log_path,
                    os.path.join(config.instances_dir, spec.host),
                    node.ip,
                    node.node_id,
                )
                launch.instances.append(inst)
                starts.append(
                    actor.start.remote(node_config, blobs, node_launch_env(spec.env), grace)
                )
            infos = ray.get(starts, timeout=settings.number("SHIPYARD_RAY_START_TIMEOUT"))
        except BaseException as exc:
            self._teardown(ray, launch)
            if isinstance(exc, BackendError):
                raise
            raise BackendError(
                f"could not start the job's instances on Ray: {type(exc).__name__}: {exc}"
            ) from exc
        handles = []
        for inst, info in zip(launch.instances, infos):
            inst.pid = info["pid"]
            os.makedirs(os.path.dirname(inst.log_path), exist_ok=True)
            open(inst.log_path, "ab").close()
            handle = InstanceHandle(
                inst.host, inst.pid or 0, inst.log_path, address=addresses[inst.host]
            )
            self._by_key[_key(handle)] = inst
            handles.append(handle)
        launch.thread = threading.Thread(
            target=self._monitor, args=(ray, launch), name="shipyard-ray-monitor", daemon=True
        )
        launch.thread.start()
        return handles

    def _blobs(self, ray: Any, config: AgentConfig) -> dict[str, Any]:
        """The code bundle, local channels and extra python paths, once in the object store."""
        source = config.submit_directory.removeprefix("file://")
        if os.path.isdir(source):
            bundle = ray_node.pack(
                [(os.path.join(source, n), n) for n in os.listdir(source)], compress=True
            )
        else:
            with open(source, "rb") as fh:
                bundle = fh.read()
        blobs = {"bundle": ray.put(bundle)}
        for name, value in config.channel_sources.items():
            if "://" not in value:  # s3:// and the like: each node reads them itself
                blobs[f"channel:{name}"] = ray.put(ray_node.pack_contents(value))
        for i, path in enumerate(config.extra_python_path):
            blobs[f"pythonpath:{i}"] = ray.put(ray_node.pack_contents(path))
        return blobs

    # -- watching -------------------------------------------------------------------------
    def _monitor(self, ray: Any, launch: _Launch) -> None:
        try:
            self._watch(ray, launch)
        except BaseException as exc:  # noqa: BLE001 - never leave the supervisor polling forever
            for inst in launch.instances:
                if inst.code is None:
                    self._lost(inst, f"shipyard's Ray monitor failed: {type(exc).__name__}: {exc}")
        finally:
            self._teardown(ray, launch)

    def _watch(self, ray: Any, launch: _Launch) -> None:
        """One round per ``interval`` (0.01 s doubling to 0.2 s while nothing comes back,
        0.02 s after new log bytes). ``ray.wait`` returns as soon as every tick is back,
        which is at once when nothing changed: unpaced, this loop asked each actor for its
        log as fast as Ray answers, which kept every InstanceActor and the supervisor busy
        for the whole job (a core's quarter per instance, measured in docs/decisions.md)."""
        interval = 0.01
        while True:
            running = [i for i in launch.instances if i.code is None]
            if not running:
                return
            round_start = time.monotonic()
            for inst in running:
                if inst.pending is None:
                    inst.pending = inst.actor.tick.remote()
            refs = [i.pending for i in running]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=interval)
            got_data = False
            for inst in running:
                if inst.pending not in ready:
                    continue
                ref, inst.pending = inst.pending, None
                try:
                    data, code = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    self._lost(inst, exc)
                    continue
                if data:
                    got_data = True
                    with open(inst.log_path, "ab") as fh:
                        fh.write(data)
                if code is not None:
                    self._collect(ray, inst, code)
            interval = 0.02 if got_data else min(interval * 2, 0.2)
            rest = round_start + interval - time.monotonic()
            if rest > 0 and any(i.code is None for i in launch.instances):
                time.sleep(rest)

    def _collect(self, ray: Any, inst: _Instance, code: int) -> None:
        """Bring the instance's results home, then publish its exit status."""
        try:
            results = ray.get(
                inst.actor.finish.remote(), timeout=settings.number("SHIPYARD_RAY_START_TIMEOUT")
            )
            for part in (*ray_node.RESULT_PARTS,):
                _rmtree(os.path.join(inst.base, part))
            shared = os.path.join(os.path.dirname(os.path.dirname(inst.base)), "shared")
            staging = inst.base + ".incoming"
            _rmtree(staging)
            ray_node.unpack(results, staging)
            os.makedirs(inst.base, exist_ok=True)
            for part in ray_node.RESULT_PARTS:
                if os.path.isdir(os.path.join(staging, part)):
                    os.replace(os.path.join(staging, part), os.path.join(inst.base, part))
            _merge(os.path.join(staging, "shared"), shared)
            self._record_resources(inst, os.path.join(staging, ray_node.RESOURCES_NAME))
            _rmtree(staging)
        except Exception as exc:  # noqa: BLE001 - any failure here is the instance's
            if not inst.stopping:
                self._lost(inst, exc, "could not bring the instance's results back from")
                return
        inst.code = code

    @staticmethod
    def _record_resources(inst: _Instance, node_record: str) -> None:
        """Add what the instance got of its node to the job's resources.json (describe)."""
        job_dir = os.path.dirname(os.path.dirname(inst.base))
        try:
            with open(node_record, encoding="utf-8") as fh:
                node = json.load(fh)
        except (OSError, ValueError):
            return  # the node wrote none (no allotment): describe shows no Resources
        from shipyard.backends.resources import read_record, write_record

        merged = ray_node.merge_resources(read_record(job_dir), node, inst.host, inst.node_ip)
        write_record(job_dir, merged)

    def _lost(
        self,
        inst: _Instance,
        exc: BaseException | str,
        what: str = "lost the instance: its actor or",
    ) -> None:
        """The actor or its node died (or results could not be fetched): the failure
        reason names the node."""
        if inst.stopping:
            inst.code = 137
            return
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        kind = exc if isinstance(exc, str) else type(exc).__name__
        text = (
            f"shipyard {what} the Ray node {inst.node_ip} (node id {inst.node_id[:12]}) "
            f"running {inst.host} died or became unreachable: {kind}"
            + (f": {detail}" if detail and not isinstance(exc, str) else "")
        )
        failure = InstancePaths(inst.base).failure_file
        os.makedirs(os.path.dirname(failure), exist_ok=True)
        with open(failure, "w", encoding="utf-8") as fh:
            fh.write(text)
        with open(inst.log_path, "ab") as fh:
            fh.write(f"[shipyard-ray] {text}\n".encode())
        inst.code = 1

    def _teardown(self, ray: Any, launch: _Launch) -> None:
        from ray.util.placement_group import remove_placement_group

        for inst in launch.instances:
            try:
                ray.kill(inst.actor, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - best effort: the actor may be gone
                pass
        try:
            remove_placement_group(launch.pg)
        except Exception:  # noqa: BLE001, S110 - best effort: the cluster may be gone
            pass

    # -- the Backend protocol -------------------------------------------------------------
    def poll(self, handle: InstanceHandle) -> int | None:
        inst = self._by_key.get(_key(handle))
        if inst is None:
            return -1  # not launched by this process: its actors ended with their owner
        return inst.code

    def stop(self, handles: list[InstanceHandle], grace: float) -> None:
        insts = [i for i in (self._by_key.get(_key(h)) for h in handles) if i is not None]
        running = [i for i in insts if i.code is None]
        for inst in running:
            inst.stopping = True
            inst.actor.stop.remote()
        if not _wait_codes(running, grace + STOP_MARGIN_S):
            ray = connect(self.address)
            for inst in running:
                if inst.code is None:
                    try:
                        ray.kill(inst.actor, no_restart=True)
                    except Exception:  # noqa: BLE001, S110 - best effort: it may be gone
                        pass
            if not _wait_codes(running, STOP_MARGIN_S):
                for inst in running:
                    if inst.code is None:
                        inst.code = 137


def _actor_class() -> type:
    from shipyard.backends.ray.actor import InstanceActor

    return InstanceActor


def _unknown(node_id: str) -> ray_placement.NodeInfo:
    raise BackendError(f"Ray placed an instance on node {node_id[:12]}, which is not alive")


def _key(handle: InstanceHandle) -> tuple[str, str]:
    return handle.host, handle.log_path


def _wait_codes(insts: list[_Instance], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(i.code is None for i in insts):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _merge(src: str, dest: str) -> None:
    """Copy files from ``src`` into ``dest`` without overwriting what is there."""
    if not os.path.isdir(src):
        return
    for dirpath, _dirs, files in os.walk(src):
        target = os.path.join(dest, os.path.relpath(dirpath, src))
        os.makedirs(target, exist_ok=True)
        for name in files:
            if not os.path.exists(os.path.join(target, name)):
                os.replace(os.path.join(dirpath, name), os.path.join(target, name))
