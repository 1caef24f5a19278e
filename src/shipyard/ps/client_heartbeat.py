"""A worker's heartbeats: a thread that tells every shard, each interval, that it lives.

Why its own object: a shard counts a worker lost when it has not heard from it for a
while (``--heartbeat-timeout``), and a worker busy computing a long step sends no
requests. The heartbeats go on their own transport and their own sender session:
their messages travel on their own connections, so their sequence numbers must not
interleave with the requests' (each session is in order for the replay guard).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from . import wire
from .client_state import ClientState
from .transport import Transport
from .wire import Header, MsgType

log = logging.getLogger("shipyard.ps.client")


class Heartbeats:
    """HEARTBEAT to every shard every ``interval`` seconds, from ``start`` until ``stop``.

    Reads the worker id, its step and the shards' sessions from ``state`` as they are at
    each beat; ``make_signer`` and ``make_transport`` build the thread's own session and
    connections."""

    def __init__(
        self,
        state: ClientState,
        make_signer: Callable[[], wire.Signer],
        make_transport: Callable[[], Transport],
        interval: float,
    ) -> None:
        self._state = state
        self._make_signer = make_signer
        self._make_transport = make_transport
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        signer = self._make_signer()
        self._thread = threading.Thread(
            target=self._run, args=(signer,), name=f"ps-heartbeat-{self._state.worker_id}",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (a few seconds at most)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self, signer: wire.Signer) -> None:
        state = self._state
        t = self._make_transport()
        try:
            while not self._stop.wait(self._interval):
                for i in range(t.num_shards):
                    hdr = Header(
                        msg_type=MsgType.HEARTBEAT,
                        worker=state.worker_id,
                        shard=i,
                        step=state.step,
                        mac_alg=signer.alg,
                        peer=state.peers[i],
                    )
                    t.send(i, wire.encode(signer, hdr))
        except Exception as exc:  # noqa: BLE001  # pragma: no cover - socket torn down at exit
            log.debug("heartbeat thread stopped: %s", exc)
        finally:
            t.close()
