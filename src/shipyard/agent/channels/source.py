"""A channel's objects as this instance sees them: listed, then sharded.

``ChannelSource`` is plain data (no secrets) so the agent can hand it to the Pipe
feeder process as a small JSON file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from shipyard import storage
from shipyard.agent.channels.sharding import select
from shipyard.jobplan.config import AgentConfig
from shipyard.storage import ObjectInfo, Store


@dataclass
class ChannelSource:
    name: str
    uri: str
    mode: str
    hosts: list[str]
    host: str
    options: dict = field(default_factory=dict)  # the inputdataconfig.json entry
    data_type: str = "S3Prefix"
    endpoint_url: str | None = None

    @classmethod
    def of(cls, config: AgentConfig, host: str, name: str) -> ChannelSource:
        options = dict(config.input_data_config.get(name, {}))
        return cls(
            name=name,
            uri=config.channel_sources[name],
            mode=str(options.get("TrainingInputMode", "File")),
            hosts=list(config.hosts),
            host=host,
            options=options,
            data_type=config.data.get("data_types", {}).get(name, "S3Prefix"),
            endpoint_url=config.data.get("endpoint_url"),
        )

    @property
    def remote(self) -> bool:
        return storage.is_remote(self.uri)

    @property
    def mounts(self) -> bool:
        """Whether staging it mounts a filesystem (FastFile from a remote store)."""
        return self.mode == "FastFile" and self.remote

    @property
    def sharded(self) -> bool:
        return self.options.get("S3DistributionType") == "ShardedByS3Key" and len(self.hosts) > 1

    def objects(self) -> tuple[Store, list[ObjectInfo]]:
        """This instance's share of the channel, in key order."""
        objects = storage.list_channel(self.uri, self.data_type, self.endpoint_url)
        mine = select(objects, str(self.options.get("S3DistributionType")), self.hosts, self.host)
        loc = mine[0].location if mine else storage.parse(self.uri)
        return storage.store_for(loc, self.endpoint_url), mine

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def load(cls, path: str) -> ChannelSource:
        with open(path, encoding="utf-8") as fh:
            return cls(**json.load(fh))
