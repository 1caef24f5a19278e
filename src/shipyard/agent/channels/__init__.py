"""Data channels and checkpoints of one instance (agent side).

``prepare()`` runs before the script starts: File channels are staged (``file.py``),
FastFile channels mounted (``fastfile.py``), the first FIFO of each Pipe channel made
and its feeder planned as a service process (``pipe.py``), existing checkpoints copied
in and their upload thread started (``checkpoints.py``). ``ChannelSession.close()``
runs after the script ended: last checkpoint upload, FastFile unmounts.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from collections.abc import Callable

from shipyard import settings
from shipyard.agent.channels import fastfile, file, fuse
from shipyard.agent.channels.checkpoints import CheckpointSync
from shipyard.agent.channels.pipe import fifo_path, make_fifo
from shipyard.agent.channels.source import ChannelSource
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.layout import InstancePaths, checkpoint_dir
from shipyard.jobplan.runner import ProcessSpec

Log = Callable[[str], None]


def instance_path(paths: InstancePaths, path: str) -> str:
    """A path as the script names it (``/opt/ml/...``) -> this instance's tree."""
    if path == "/opt/ml" or path.startswith("/opt/ml/"):
        return (
            os.path.join(paths.base, path[len("/opt/ml/") :]) if path != "/opt/ml" else paths.base
        )
    return path


class ChannelSession:
    def __init__(self, paths: InstancePaths, log: Log) -> None:
        self.paths = paths
        self.log = log
        self.pipes: list[ChannelSource] = []
        self.mounts: list[tuple[str, fuse.FuseMount, fastfile.ChunkCache, int]] = []
        self.checkpoints: CheckpointSync | None = None
        self.tensorboard: CheckpointSync | None = None

    def services(self) -> list[ProcessSpec]:
        """One feeder process per Pipe channel (role service: stopped with the script)."""
        specs = []
        for source in self.pipes:
            spec_file = os.path.join(self.paths.agent_dir, f"pipe-{source.name}.json")
            with open(spec_file, "w", encoding="utf-8") as fh:
                fh.write(source.to_json())
            failure = os.path.join(self.paths.agent_dir, f"pipe-{source.name}.failure")
            if os.path.exists(failure):
                os.remove(failure)
            specs.append(
                ProcessSpec(
                    name=f"pipe-feeder-{source.name}",
                    argv=[
                        sys.executable,
                        "-m",
                        "shipyard.agent.channels.feeder",
                        "--source",
                        spec_file,
                        "--input-data",
                        self.paths.input_data,
                        "--failure-file",
                        failure,
                    ],
                    env=dict(os.environ),
                    cwd=self.paths.agent_dir,
                    role="service",
                    user_facing=False,
                    failure_file=failure,
                )
            )
        return specs

    def close(self) -> None:
        """After the script: final checkpoint upload, then unmount FastFile channels."""
        try:
            if self.checkpoints is not None:
                self.checkpoints.finish()
            if self.tensorboard is not None:
                self.tensorboard.finish()
        finally:
            for name, mount, cache, total in self.mounts:
                self.log(
                    f"channel {name} (FastFile): read {len(cache.fetched_objects)} of "
                    f"{total} objects, fetched {cache.fetched_bytes / 1e6:.1f} MB"
                )
                mount.unmount()
            self.mounts = []


def _clear(target: str) -> None:
    """Remove what an earlier attempt left at a channel path (a link, FIFO, dead mount)."""
    if os.path.ismount(target) or _dead_mount(target):
        ctypes.CDLL(None, use_errno=True).umount2(target.encode(), fuse.MNT_DETACH)
    if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
        os.remove(target)


def _dead_mount(path: str) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == 107  # ENOTCONN: a FUSE server that went away
    return False


def _stage(source: ChannelSource, target: str, log: Log) -> None:
    """File mode (and FastFile's fallback): the data is in ``target`` when this returns."""
    store, objects = source.objects()
    if not source.remote and not source.sharded:
        file.link_directory(source.uri, target)
        log(f"channel {source.name} ({source.mode}): linked {source.uri}")
    elif not source.remote:
        file.link_objects(objects, target)
        log(
            f"channel {source.name} ({source.mode}): linked {len(objects)} file(s) "
            f"(shard of {source.uri})"
        )
    else:
        file.download_objects(
            store, objects, target, f"channel {source.name} ({source.mode}) from {source.uri}", log
        )


def mounts_anything(config: AgentConfig, host: str) -> bool:
    """Whether ``prepare`` may mount a filesystem (a FastFile channel of a remote
    source): a mount namespace copied before it would miss that mount."""
    return any(ChannelSource.of(config, host, name).mounts for name in config.channel_sources)


def prepare(config: AgentConfig, host: str, paths: InstancePaths, log: Log) -> ChannelSession:
    session = ChannelSession(paths, log)
    os.makedirs(paths.agent_dir, exist_ok=True)
    shutil.rmtree(os.path.join(paths.base, "pipe_state"), ignore_errors=True)
    try:
        for name in config.channel_sources:
            source = ChannelSource.of(config, host, name)
            target = paths.channel(name)
            _clear(target)
            if source.mode == "Pipe":
                for entry in os.listdir(paths.input_data):  # FIFOs of an earlier attempt
                    if entry.startswith(name + "_") and entry[len(name) + 1 :].isdigit():
                        os.remove(os.path.join(paths.input_data, entry))
                make_fifo(fifo_path(paths.input_data, name, 0))
                session.pipes.append(source)
            elif source.mounts:
                reason = fuse.usable()
                if reason is None:
                    store, objects = source.objects()
                    cache_dir = os.path.join(paths.agent_dir, "fastfile-cache", name)
                    shutil.rmtree(cache_dir, ignore_errors=True)
                    mount, cache = fastfile.mount(store, objects, target, cache_dir, name, log)
                    session.mounts.append((name, mount, cache, len(objects)))
                    log(
                        f"channel {name} (FastFile): {len(objects)} objects of {source.uri} "
                        "mounted; fetched as they are read"
                    )
                else:
                    log(
                        f"channel {name} (FastFile): FUSE is not usable here ({reason}); "
                        "staging it like File mode before the script starts"
                    )
                    _stage(source, target, log)
            else:
                _stage(source, target, log)
        uri = config.data.get("checkpoint_uri")
        if uri:
            local = checkpoint_dir(config, paths)
            session.checkpoints = CheckpointSync(uri, local, config.data.get("endpoint_url"), log)
            count = session.checkpoints.restore()
            log(f"checkpoints: {count} object(s) copied in from {uri} to {local}")
            session.checkpoints.start()
        tensorboard = config.data.get("tensorboard")
        if tensorboard:
            local = instance_path(paths, tensorboard["local_path"])
            os.makedirs(local, exist_ok=True)
            session.tensorboard = CheckpointSync(
                tensorboard["uri"],
                local,
                config.data.get("endpoint_url"),
                log,
                what="tensorboard",
                interval=settings.number("SHIPYARD_TENSORBOARD_SYNC_SECONDS"),
            )
            log(f"tensorboard: {local} is synced to {tensorboard['uri']}")
            session.tensorboard.start()
    except BaseException:
        for _, mount, _, _ in session.mounts:
            mount.unmount()
        raise
    return session
