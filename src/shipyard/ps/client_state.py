"""What the parts of a ``PSClient`` share: one small dataclass, passed to each.

Why: the client is put together from objects with one job each (requests.py builds
requests, exchange.py moves them, data.py is the training step's API); they need the
same few facts about this worker's conversation with the shards. Those live here,
in one place, and each part receives them in its constructor, so that no part
re-declares another's attributes by hand.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from .integrity import Signer
from .placement import KeyPlacement


@dataclass
class ClientState:
    """This worker's side of its conversation with every shard."""

    worker_id: int
    signer: Signer  # this client's MAC and its session (every request carries it)
    endpoints: list[str]  # shard i's endpoint, for messages that name a shard
    timeout: float  # seconds without progress before a call raises PSTimeoutError
    #: each shard's session, learned from its HELLO reply; every later request names it
    #: (0: not known yet, the replay guard of the shard would drop the request)
    peers: list[int]
    step: int = 0  # this worker's step: stamped into every request
    many: bool = False  # every shard takes PUSH_PULL_MANY (learned in hello)
    keys: dict[str, KeyPlacement] = field(default_factory=dict)  # registered name -> placement
    rids: Iterator[int] = field(default_factory=lambda: itertools.count(1))  # request ids

    @property
    def num_shards(self) -> int:
        return len(self.peers)
