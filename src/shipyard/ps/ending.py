"""How a shard of a job ends by itself: once every expected worker has ended (DONE, lost,
or never joined within ``join_timeout``), the held DONE requests are answered with the
job's outcome and the shard stops; its exit code and text say whether training failed.

``JobEnd`` is one object of a ``ServerCore`` (core.py): it keeps what the end of the
job is decided from (the ranks heard from, the exits their wrappers reported, the held
DONE requests) and is given the shard's configuration, worker table, replier and a
way to build the final STATS body in its constructor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .consistency import WorkerTable, job_outcome
from .replies import Outgoing, Replier
from .shard_config import ServerConfig
from .wire import Header

log = logging.getLogger("shipyard.ps.core")


class JobEnd:
    """Whether the job a shard serves has ended, and its outcome."""

    def __init__(
        self,
        config: ServerConfig,
        workers: WorkerTable,
        replies: Replier,
        started: float,
        stats_json: Callable[[float], dict[str, Any]],
    ) -> None:
        self.config = config
        self.workers = workers
        self.replies = replies
        self.started = started
        self._stats_json = stats_json
        self.joined: set[int] = set()  # ranks heard from by this process (not restored ones)
        self.exits: dict[int, int] = {}  # rank -> exit status its wrapper reported (DONE)
        self.errors: dict[int, str] = {}  # rank -> the tail of its error output
        self.held_done: list[tuple[bytes, Header]] = []  # DONE requests answered at the end
        self.placement: dict[str, Any] | None = None  # the placement report rank 0 registered
        self.outcome: dict[int, dict[str, Any]] | None = None  # set when the job has ended

    def worker_done(self, peer: bytes, h: Header, exit_code: int, error: str | None) -> None:
        """A worker's wrapper reported its exit (DONE): kept, answered when the job ends."""
        self.exits[h.worker] = exit_code
        if error is not None:
            self.errors[h.worker] = error[-2000:]
        self.held_done.append((peer, h))

    @property
    def exit_code(self) -> int:
        """0 unless the job ended with no worker that finished successfully."""
        if self.outcome is None:
            return 0
        return 0 if any(o.get("exit_code") == 0 for o in self.outcome.values()) else 1

    def failure_text(self) -> str | None:
        """Why the job's training failed when every worker failed (the shard's exit text)."""
        if self.exit_code == 0 or self.outcome is None:
            return None
        parts = [
            f"rank {r}: "
            + (f"exit status {o['exit_code']}" if "exit_code" in o else f"lost, {o['lost']}")
            for r, o in sorted(self.outcome.items())
        ]
        text = "every worker of the job failed (" + "; ".join(parts) + ")"
        first = next((r for r in sorted(self.errors) if self.errors[r].strip()), None)
        if first is not None:
            text += f". Rank {first}'s error:\n{self.errors[first].strip()}"
        return text

    def maybe_end(self, now: float) -> list[Outgoing]:
        """When every worker has ended: answer the held DONE requests and stop."""
        cfg = self.config
        if not cfg.exit_when_done or self.outcome is not None or cfg.expected_workers is None:
            return []
        outcome = job_outcome(
            cfg.expected_workers,
            self.exits,
            self.workers,
            self.joined,
            now,
            self.started,
            cfg.join_timeout,
            min(cfg.done_grace, cfg.join_timeout),
        )
        if outcome is None:
            return []
        self.outcome = outcome  # the shard stops (ServerCore.shutdown_requested)
        log.info(
            "shard %d: every worker has ended (%s); stopping",
            cfg.index,
            ", ".join(f"{r}: {o}" for r, o in sorted(outcome.items())),
        )
        body = {
            "finished": {str(r): o for r, o in sorted(outcome.items())},
            "stats": self._stats_json(now),
            "placement": self.placement,
        }
        return [self.replies.json(peer, h, body) for peer, h in self.held_done]
