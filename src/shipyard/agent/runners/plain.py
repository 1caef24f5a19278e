"""The plain runner: the user's entry point, once per instance (toolkit ProcessRunner)."""

from __future__ import annotations

from shipyard.agent.runners.api import InstanceContext, ProcessSpec


def plan(ctx: InstanceContext) -> list[ProcessSpec]:
    return [
        ProcessSpec(name="user", argv=list(ctx.user_command), env=dict(ctx.env), cwd=ctx.paths.code)
    ]
