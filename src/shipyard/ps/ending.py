"""How a shard of a job ends by itself: once every expected worker has ended (DONE, lost,
or never joined within ``join_timeout``), the held DONE requests are answered with the
job's outcome and the shard stops; its exit code and text say whether training failed.

``JobEnd`` is a mixin of ``ServerCore`` (core.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .consistency import WorkerTable, job_outcome
from .replies import Outgoing, Replier
from .wire import Header

log = logging.getLogger("shipyard.ps.core")


class JobEnd:
    # what it uses of ServerCore
    config: Any
    workers: WorkerTable
    replies: Replier
    joined: set[int]
    exits: dict[int, int]
    errors: dict[int, str]
    held_done: list[tuple[bytes, Header]]
    placement: dict[str, Any] | None
    outcome: dict[int, dict[str, Any]] | None
    started: float
    shutdown_requested: bool
    stats_json: Callable[..., dict[str, Any]]

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

    def _maybe_end(self, now: float) -> list[Outgoing]:
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
        self.outcome = outcome
        self.shutdown_requested = True
        log.info(
            "shard %d: every worker has ended (%s); stopping",
            cfg.index,
            ", ".join(f"{r}: {o}" for r, o in sorted(outcome.items())),
        )
        body = {
            "finished": {str(r): o for r, o in sorted(outcome.items())},
            "stats": self.stats_json(now),
            "placement": self.placement,
        }
        return [self.replies.json(peer, h, body) for peer, h in self.held_done]
