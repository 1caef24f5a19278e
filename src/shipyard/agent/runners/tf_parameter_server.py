"""TensorFlow parameter servers, one per instance, the way SageMaker runs them.

Per instance (layout ``tf2``, the default, for ``tf.distribute.ParameterServerStrategy``):

* ``ps:k``: a ``tf.distribute.Server`` on the CPU, plus the instance's byte-counting
  relays (shipyard.tf.server); critical: a lost ps fails the job with its reason.
* ``worker:k``: a ``tf.distribute.Server`` that only serves the coordinator; not
  critical: TensorFlow re-dispatches a lost worker's functions, so the job goes on.
* on algo-1 only, ``chief``: the user's script (the coordinator) under
  ``shipyard.tf.chief``, which writes the placement/traffic report when it ends.

Layout ``sagemaker`` (TF1-style scripts): the user's script on every instance as
``master`` (algo-1) or ``worker``, plus the ``ps`` process; workers are not critical.

The chief decides the job (``deciding_hosts``): when it ends, every server is stopped
and the job finishes within seconds -- parameter servers never keep a job alive. With
a single instance the script runs plainly, as SageMaker does.

Keras: ParameterServerStrategy needs tf_keras (Keras 2), so the tf2 layout sets
``TF_USE_LEGACY_KERAS=1`` and says so; Keras 3 scripts use
``{'parameter_server': {'enabled': True, 'implementation': 'shipyard'}}`` (shipyard.ps).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from shipyard.agent.runners import plain
from shipyard.agent.runners.tf_processes import (
    private_ports,
    relay_arg,
    server_env,
    server_spec,
    user_env,
    with_hook,
)
from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.jobplan.runners import TFParameterServerRules
from shipyard.tf import cluster

LEGACY_KERAS_NOTE = (
    "parameter_server (tf2 layout): TF_USE_LEGACY_KERAS=1 is set, so tf.keras is tf_keras "
    "(Keras 2), which ParameterServerStrategy needs; Keras 3 has no parameter-server "
    "training: for a Keras 3 script use {'parameter_server': {'enabled': True, "
    "'implementation': 'shipyard'}}"
)


def with_chief_model_dir(ctx: InstanceContext, argv: list[str]) -> list[str]:
    """A ps task that sees the chief's model dir at /opt/ml/model (a mount namespace of
    its own, made by the launcher before it drops privileges: shipyard.sandbox.launch).

    The chief's ``model.save('/opt/ml/model/1')`` makes every ps task write its variables'
    shard under that path on its own instance. Without sandboxes the path was the chief's
    tree on the one shared disk; in a sandbox each instance has its own /opt/ml, so the ps
    tasks (only they) get the chief's model dir there, and the SavedModel is whole.
    Found by three concurrent sandboxed jobs: algo-2's ps task started before algo-1's
    agent had created its tree, and the bind mount failed (the launcher creates it)."""
    chief_model = os.path.join(ctx.config.instances_dir, ctx.config.hosts[0], "model")
    from shipyard.sandbox.confine import with_binds

    return with_binds(argv, [(chief_model, "/opt/ml/model")])


def plan(ctx: InstanceContext, picker: Callable[[], int] = cluster.free_port) -> list[ProcessSpec]:
    hosts = ctx.config.hosts
    if len(hosts) == 1:
        ctx.notes.append(
            "parameter_server with a single instance: running the script "
            "without parameter servers (as SageMaker does); TF_CONFIG is not set"
        )
        return plain.plan(ctx)
    options = TFParameterServerRules().restore(ctx.config.runner_options, len(hosts), 0)
    layout = options.layout
    tasks = cluster.ps_tasks(layout, hosts, options.ports)
    mine = cluster.tasks_on(tasks, ctx.host)
    ports = private_ports(mine, picker)
    ip = ctx.address
    addresses = ctx.config.addresses

    def config_for(task: cluster.Task) -> str:
        return cluster.encode(cluster.tf_config(tasks, addresses, task, ports[task]))

    relays = [relay_arg(t.name, (ip, t.port), (ip, ports[t])) for t in mine]
    ps = next(t for t in mine if t.type == "ps")
    is_chief = ctx.host == hosts[0]
    specs = [
        server_spec(
            ctx,
            ps.name,
            server_env(ctx, config_for(ps), ps.name, cpu_only=True),
            serve=True,
            cpu_only=True,
            relays=relays,
            role="service" if is_chief else "main",
        )
    ]
    if ctx.config.sandboxed and not is_chief:
        specs[0].argv = with_chief_model_dir(ctx, specs[0].argv)
    for task in mine:
        if task.type == "ps":
            continue
        if layout == "tf2" and task.type == "worker":
            env = server_env(ctx, config_for(task), task.name, cpu_only=False)
            env["TF_USE_LEGACY_KERAS"] = "1"
            specs.append(
                server_spec(
                    ctx,
                    task.name,
                    env,
                    serve=True,
                    role="service" if is_chief else "main",
                    critical=False,
                )
            )
            continue
        env = user_env(ctx, config_for(task), task.name)
        if layout == "tf2":
            env["TF_USE_LEGACY_KERAS"] = "1"
        if task.type in ("chief", "master"):
            specs.append(_chief_spec(ctx, task, env, tasks, layout))
        else:  # a SageMaker-layout worker: the user's script, whose loss training survives
            specs.append(
                ProcessSpec(
                    name=task.name,
                    argv=list(ctx.user_command),
                    env=env,
                    cwd=ctx.paths.code,
                    critical=False,
                )
            )
    if layout == "tf2" and is_chief:
        ctx.notes.append(LEGACY_KERAS_NOTE)
    if ctx.config.num_gpus > 1:
        ctx.notes.append(
            "parameter_server runs one worker per host whatever the number of "
            f"GPUs ({ctx.config.num_gpus} here), as SageMaker does"
        )
    ctx.notes.append(
        f"{ctx.host}: TensorFlow tasks "
        + ", ".join(f"{t.name} at {ip}:{t.port}" for t in mine)
        + f" ({layout} layout)"
    )
    return specs


def _chief_spec(
    ctx: InstanceContext,
    task: cluster.Task,
    env: dict[str, str],
    tasks: dict[str, list[cluster.Task]],
    layout: str,
) -> ProcessSpec:
    """The user's script wrapped by shipyard.tf.chief, with the placement hook loaded."""
    addresses = ctx.config.addresses
    placement_file = os.path.join(ctx.paths.agent_dir, "tf-placement.json")
    env["SHIPYARD_JOB_SECRET"] = ctx.config.job_secret
    with_hook(env)
    argv = [
        sys.executable,
        "-m",
        "shipyard.tf.chief",
        "--report",
        ctx.paths.report_file,
        "--placement",
        placement_file,
        "--ps",
        ",".join(f"{addresses[t.host]}:{t.port}" for t in tasks["ps"]),
        "--hosts",
        ",".join(t.host for t in tasks["ps"]),
        "--layout",
        layout,
        "--",
        *ctx.user_command,
    ]
    return ProcessSpec(name=task.name, argv=argv, env=env, cwd=ctx.paths.code)


class TFParameterServerRunner(TFParameterServerRules):
    def plan(self, ctx: InstanceContext) -> list[ProcessSpec]:
        return plan(ctx)
