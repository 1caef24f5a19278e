"""The torch_distributed runner: ``torch_distributed``, ``pytorchddp`` and
``smdistributed.dataparallel`` as torchrun would run them.

Per instance, ``processes_per_host`` ranks (default: the instance's GPU count, else 1),
each under shipyard.ddp.rank with the full torchrun environment; on algo-1 also the
rendezvous service (shipyard.ddp.rendezvous) that hosts the job's store. With no
arguments ``dist.init_process_group()`` then picks gloo for CPU tensors and NCCL for
CUDA ones (torch's default backend map). The smddp shim is on PYTHONPATH for all three
forms, so SMDDP scripts run unmodified. How the parts meet: shipyard/ddp/__init__.py.

Options (inside the distribution's dict): ``processes_per_host``, ``master_port`` (first
MASTER_PORT tried, default 7777 as on SageMaker), ``rendezvous_timeout`` (seconds the
other ranks get to join after the first one did; default 900, torchrun's join timeout).
"""

from __future__ import annotations

import logging
import os
import sys

from shipyard import settings
from shipyard.ddp import contract, shim_path
from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.jobplan.runners import TorchDistributedRules

logger = logging.getLogger("shipyard.agent")
SHIM_ENV = "SHIPYARD_SMDDP_SHIM"  # "off": leave the smdistributed shim off PYTHONPATH


def plan(ctx: InstanceContext) -> list[ProcessSpec]:
    config = ctx.config
    options = TorchDistributedRules().restore(config.runner_options, len(config.hosts), 0)
    hosts = list(config.hosts)
    nproc = options.processes_per_host or config.num_gpus or 1
    master_addr = config.addresses[hosts[0]]
    # what the ranks see: the name, as SageMaker's launcher passes it, where libc resolves
    # it (an instance sandbox); else the address, for native code that cannot
    rank_master_addr = hosts[0] if config.sandboxed else master_addr
    attempt = settings.optional_integer("SHIPYARD_ATTEMPT", ctx.env) or 1
    max_restarts = settings.optional_integer("SHIPYARD_MAX_RETRY_ATTEMPTS", ctx.env) or 0
    master_ports = contract.master_ports(options.master_port)
    announce_ports = ",".join(map(str, contract.announce_ports(config.job_secret, config.job_name)))
    timeout = str(options.rendezvous_timeout)
    work = os.path.join(ctx.paths.agent_dir, "ddp", f"attempt-{attempt}")
    os.makedirs(work, exist_ok=True)
    rank_failure = os.path.join(work, "failure")

    base = dict(ctx.env)
    base["SHIPYARD_DDP_SECRET"] = config.job_secret
    if (settings.optional_text(SHIM_ENV) or "").lower() != "off":
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [base.get("PYTHONPATH"), shim_path()]))

    specs = []
    if ctx.host_index == 0:
        specs.append(
            ProcessSpec(
                name="rendezvous",
                role="service",
                user_facing=False,
                env=dict(base),
                cwd=ctx.paths.code,
                failure_file=os.path.join(work, "rendezvous.failure"),
                argv=[
                    sys.executable,
                    "-m",
                    "shipyard.ddp.rendezvous",
                    "--addr",
                    master_addr,
                    "--master-ports",
                    ",".join(map(str, master_ports)),
                    "--announce-ports",
                    announce_ports,
                    "--hosts",
                    ",".join(hosts),
                    "--nproc",
                    str(nproc),
                    "--timeout",
                    timeout,
                    "--linger",
                    str(max(0.5, settings.number("SHIPYARD_STOP_GRACE", ctx.env) - 1)),
                    "--failure-file",
                    os.path.join(work, "rendezvous.failure"),
                ],
            )
        )
    wrapper = [
        sys.executable,
        "-m",
        "shipyard.ddp.rank",
        "--announce-addr",
        master_addr,
        "--announce-ports",
        announce_ports,
        "--hosts",
        ",".join(hosts),
        "--failure-file",
        rank_failure,
        "--",
    ]  # finding the service: its own timeout
    for rank in contract.ranks_of(ctx.host_index, nproc, len(hosts)):
        env = dict(base)
        env.update(
            contract.rank_env(
                rank,
                master_addr=rank_master_addr,
                master_port=master_ports[0],
                restart_count=attempt - 1,
                max_restarts=max_restarts,
                run_id=config.job_name,
                inherited=ctx.env,
                error_file=os.path.join(work, f"rank-{rank.rank}.error.json"),
            )
        )
        specs.append(
            ProcessSpec(
                name=f"rank-{rank.rank}",
                argv=wrapper + list(ctx.user_command),
                env=env,
                cwd=ctx.paths.code,
                failure_file=rank_failure,
            )
        )
    ctx.notes.append(
        f"{ctx.host}: {options.kind} via DDP: ranks "
        f"{nproc * ctx.host_index}..{nproc * (ctx.host_index + 1) - 1} of "
        f"{nproc * len(hosts)}, MASTER_ADDR={master_addr}"
    )
    return specs


class TorchDistributedRunner(TorchDistributedRules):
    def plan(self, ctx: InstanceContext) -> list[ProcessSpec]:
        return plan(ctx)
