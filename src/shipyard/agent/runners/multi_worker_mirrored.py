"""TensorFlow's MultiWorkerMirroredStrategy: every instance a worker, as SageMaker runs it.

TF_CONFIG lists every instance as a ``worker`` on SageMaker's port 8890
(``{'multi_worker_mirrored_strategy': {'enabled': True, 'port': N}}`` to change it),
with ``"environment": "cloud"`` as the toolkit writes it. The user's script runs on
every instance and each one's result counts. As for the parameter servers, a
process sees its own task at a private port and the others at their public address,
served by a byte-counting relay (see shipyard.tf.cluster for why).

Keras 3 (3.15) ``model.fit`` fails under this strategy with more than one worker
(keras-team/keras#20585); with more than one instance the script's process loads
shipyard's hook, which fixes the two faulty Keras functions when (and if) the script
imports Keras, and says so in one log line (shipyard.tf.keras_compat).
"""

from __future__ import annotations

from collections.abc import Callable

from shipyard.agent.runners.tf_processes import (
    private_ports,
    relay_arg,
    server_env,
    server_spec,
    user_env,
    with_hook,
)
from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.jobplan.runners import MWMSRules
from shipyard.tf import cluster, keras_compat


def plan(ctx: InstanceContext, picker: Callable[[], int] = cluster.free_port) -> list[ProcessSpec]:
    hosts = ctx.config.hosts
    options = MWMSRules().restore(ctx.config.runner_options, len(hosts), 0)
    tasks = cluster.mwms_tasks(hosts, options.port)
    (me,) = cluster.tasks_on(tasks, ctx.host)
    ports = private_ports([me], picker)
    config = cluster.encode(cluster.tf_config(tasks, ctx.config.addresses, me, ports[me]))
    env = user_env(ctx, config, me.name)
    if len(hosts) > 1:
        env[keras_compat.COMPAT_ENV] = "1"
        with_hook(env)
    specs = [ProcessSpec(name="user", argv=list(ctx.user_command), env=env, cwd=ctx.paths.code)]
    if len(hosts) > 1:
        ip = ctx.address
        specs.append(
            server_spec(
                ctx,
                f"relay-{me.name}",
                server_env(ctx, None, f"relay-{me.name}", cpu_only=True),
                serve=False,
                relays=[relay_arg(me.name, (ip, me.port), (ip, ports[me]))],
            )
        )
    ctx.notes.append(
        f"{ctx.host}: multi_worker_mirrored_strategy {me.name} at {ctx.address}:{me.port}"
    )
    return specs


class MWMSRunner(MWMSRules):
    def plan(self, ctx: InstanceContext) -> list[ProcessSpec]:
        return plan(ctx)
