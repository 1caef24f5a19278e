"""The plain runner: the user's entry point, once per instance (toolkit ProcessRunner).

For the PyTorch framework it also sets what SageMaker's PyTorch container sets for every
job (sagemaker_pytorch_container.training._set_distributed_environment):
``MASTER_ADDR`` (the master host) and ``MASTER_PORT=7777``, so a plain multi-instance
script that calls ``init_process_group`` finds its peers.
"""

from __future__ import annotations

from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.jobplan.runners import PlainRules

PYTORCH_MODULE = "sagemaker_pytorch_container.training:main"
MASTER_PORT = "7777"


def torch_env(ctx: InstanceContext) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT as the PyTorch container sets them (the user's own win).

    The master is ``algo-1`` by name where libc resolves it (an instance sandbox), else
    its address: gloo's C++ cannot see the Python resolver shim."""
    if ctx.config.framework_module != PYTORCH_MODULE:
        return {}
    master = ctx.config.hosts[0]
    addr = master if ctx.config.sandboxed else ctx.config.addresses[master]
    return {
        key: value
        for key, value in (("MASTER_ADDR", addr), ("MASTER_PORT", MASTER_PORT))
        if key not in ctx.config.environment
    }


def plan(ctx: InstanceContext) -> list[ProcessSpec]:
    env = dict(ctx.env)
    env.update(torch_env(ctx))
    return [ProcessSpec(name="user", argv=list(ctx.user_command), env=env, cwd=ctx.paths.code)]


class PlainRunner(PlainRules):
    def plan(self, ctx: InstanceContext) -> list[ProcessSpec]:
        return plan(ctx)
