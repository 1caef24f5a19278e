"""The native_ps runner: shipyard.ps shards and workers for ``parameter_server``.

Per instance: the shards placed on it (shard i on instance i % instance_count; one per
instance by default) and ``workers_per_host`` workers running the user's entry point,
each through ``python -m shipyard.ps.worker`` which tells the shards when it ends.

* Shards are critical: one that dies fails the instance, so the job, with a text
  that says how to resume (its failure file). They end by themselves, with a final
  checkpoint, once every worker of the job has ended or been declared lost, so the
  instances complete within moments of the last worker; a shard exits with an
  error only when no worker finished successfully.
* Workers are not critical: one that dies is recorded as lost (describe shows it)
  and the others train on; in sync mode rounds proceed with the live workers.
* Checkpoints go to checkpoint_local_path when given (shared by the instances: files
  are per shard), else the instance's checkpoints/ dir; a re-run with the same
  checkpoint location resumes the parameters, optimizer state and step counters.
* Endpoints are IPs (AgentConfig.addresses): native sockets do not see the
  resolver shim. Each instance binds only its own IP, so fixed ports work for
  several instances (and jobs) on one machine.

Worker environment: SHIPYARD_PS_SECRET (the job secret), SHIPYARD_PS_ENDPOINTS,
SHIPYARD_PS_RANK, SHIPYARD_PS_LOCAL_RANK, SHIPYARD_PS_NUM_WORKERS,
SHIPYARD_PS_POLICY, SHIPYARD_PS_REPORT (rank 0's live report; the wrapper writes
the final one to SHIPYARD_REPORT_PATH).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from shipyard.jobplan import layout
from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.jobplan.runners import NativePSRules


def plan(ctx: InstanceContext) -> list[ProcessSpec]:
    config = ctx.config
    hosts = config.hosts
    opts = NativePSRules().restore(config.runner_options, len(hosts), 0).ps
    addresses = [config.addresses[h] for h in hosts]
    endpoints = [opts.shard_endpoint(i, addresses) for i in range(opts.num_shards)]
    num_workers = len(hosts) * opts.workers_per_host
    checkpoint_dir = layout.checkpoint_dir(config, ctx.paths)
    secret = {"SHIPYARD_PS_SECRET": config.job_secret}
    if opts.mac:
        secret["SHIPYARD_PS_MAC"] = opts.mac
    specs = [
        _shard(ctx, i, opts, endpoints[i], num_workers, checkpoint_dir, secret)
        for i in opts.shards_on(ctx.host_index, len(hosts))
    ]
    for local in range(opts.workers_per_host):
        rank = ctx.host_index * opts.workers_per_host + local
        env = dict(
            ctx.env,
            **secret,
            SHIPYARD_PS_ENDPOINTS=",".join(endpoints),
            SHIPYARD_PS_RANK=str(rank),
            SHIPYARD_PS_LOCAL_RANK=str(local),
            SHIPYARD_PS_NUM_WORKERS=str(num_workers),
            SHIPYARD_PS_POLICY=opts.policy,
            SHIPYARD_PS_REPORT=ctx.paths.report_file,
        )
        specs.append(
            ProcessSpec(
                name=f"ps-worker-{rank}",
                env=env,
                cwd=ctx.paths.code,
                critical=False,
                argv=[sys.executable, "-m", "shipyard.ps.worker", "--", *ctx.user_command],
            )
        )
    ctx.notes.append(
        f"{ctx.host}: shipyard.ps with {opts.num_shards} shard(s) at {', '.join(endpoints)}, "
        f"{num_workers} worker(s), {opts.consistency.mode} updates, checkpoints in "
        f"{checkpoint_dir}"
    )
    return specs


def _shard(
    ctx: InstanceContext,
    index: int,
    opts: Any,
    endpoint: str,
    num_workers: int,
    checkpoint_dir: str,
    secret: dict[str, str],
) -> ProcessSpec:
    from shipyard.ps.launch import shard_command

    failure_file = os.path.join(ctx.paths.agent_dir, f"ps-shard-{index}.failure")
    argv = shard_command(
        index,
        opts.num_shards,
        endpoint,
        checkpoint_dir=checkpoint_dir,
        consistency=opts.consistency.mode,
        max_staleness=opts.consistency.max_staleness,
        num_workers=num_workers,
        heartbeat_timeout=opts.heartbeat_timeout,
        checkpoint_interval=opts.checkpoint_interval,
        exit_when_done=True,
        failure_file=failure_file,
    )
    os.makedirs(ctx.paths.agent_dir, exist_ok=True)
    return ProcessSpec(
        name=f"ps-shard-{index}",
        argv=argv,
        env=dict(ctx.env, **secret),
        cwd=ctx.paths.code,
        user_facing=False,
        failure_file=failure_file,
    )


class NativePSRunner(NativePSRules):
    def plan(self, ctx: InstanceContext) -> list[ProcessSpec]:
        return plan(ctx)
