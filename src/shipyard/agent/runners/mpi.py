"""The ``mpi`` runner: SageMaker's MPI mode (Horovod scripts) with a real mpirun.

``distribution={'mpi': {'enabled': True, 'processes_per_host': N, 'custom_mpi_options': '...'}}``

SageMaker's toolkit (sagemaker_training/mpi.py): the master host (algo-1) starts sshd,
waits for the workers, and runs ``mpirun -np N*hosts ... python -m mpi4py <script>``; the
workers wait for orted to come and go. Here:

* algo-1 runs mpirun (under ``mpi_launch``, which surfaces mpirun's own errors) with
  ``-np processes_per_host x instances``, ranks placed host by host, ``--bind-to none``,
  ``--oversubscribe`` when there are more ranks than cores, ``--allow-run-as-root`` as
  root, ``-x NCCL_DEBUG=<INFO|--NCCL_DEBUG value>`` and the rest of custom_mpi_options
  verbatim, as the toolkit passes them. The user's Python command runs as
  ``python -m mpi4py ...`` (the toolkit does the same): an uncaught exception on one rank
  aborts the job instead of leaving the others waiting.
* every rank goes through the rank wrapper (``mpi_rank``), which gives it its own
  instance's environment and code directory; each agent writes its planned environment
  to ``<instance>/agent/process-env.json`` for it.
* the other instances run a main process that only waits (``mpi_launch --wait``); algo-1
  is the only deciding host, so the control plane stops them when it has finished.
* processes_per_host defaults to the instance's GPU count, else 1 (the toolkit's rule).
* failure: the first rank whose command fails on its own writes the job's root cause
  (``rank 3 (algo-2): ...``, exception line first); ranks that only die in the teardown
  stay silent; mpirun's own refusal (a bad custom_mpi_options) is the reason when no rank
  ran. A rank that never calls ``hvd.init()`` is named once the others have waited
  ``SHIPYARD_HOROVOD_INIT_TIMEOUT`` seconds (default 120; set it in ``environment``).
* scripts that ``import horovod`` get shipyard.horovod when no real Horovod is installed
  (the shim dir goes on the ranks' PYTHONPATH; the shim logs one line on rank 0).
* ``smdistributed.dataparallel`` with the TensorFlow estimator runs here too (SMDDP's
  TensorFlow client was MPI-launched and Horovod-like): the ranks also get the
  ``smdistributed`` shim, whose ``smdistributed.dataparallel.tensorflow`` is
  shipyard.horovod.tensorflow under SMDDP's names.

On the local backend all instances are on this machine, so mpirun starts every rank here.
A multi-machine backend (Ray) sets ``SHIPYARD_MPI_LAUNCH=rsh``: mpirun then gets the
instances' IPs as hosts and ``mpi_rsh`` as its rsh agent, and every other instance serves
(``mpi_rsh --serve``) instead of waiting: it starts prted on its own node when the master
asks, with the plan shipped to it, so no ssh and no shared filesystem are needed.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import shlex
import shutil
import sys
from typing import Any

from shipyard import settings
from shipyard.ddp import shim_path as ddp_shim_path
from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.jobplan.runners import MpiRules
from shipyard.mpi import command as mpi_command
from shipyard.mpi import rsh as mpi_rsh
from shipyard.sandbox import bindshim

SMDDP_KIND = "smdistributed.dataparallel"  # = shipyard.distribution.SMDDP
SMDDP_SHIM_ENV = "SHIPYARD_SMDDP_SHIM"  # "off": leave the smdistributed shim off PYTHONPATH
ENV_FILE = "process-env.json"
PLAN_FILE = "mpi-plan.json"
FAILURE_FILE = "mpi-failure.txt"
RUN_DIR = "mpi-run"
# How long a rank waits for its instance's agent to plan, and (shipyard.horovod) for the
# other ranks in hvd.init(); the latter is SHIPYARD_HOROVOD_INIT_TIMEOUT in `environment`.
ENV_TIMEOUT_S = 120.0


def _write_private_json(path: str, obj: Any) -> None:
    """Atomically, mode 0600 (the environment may hold credentials)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def sandbox_mca(interface: str) -> dict[str, str]:
    """Open MPI on the job network only. A sandboxed instance also has pasta's ``tap0``,
    which carries the host's own address in every instance: a rank that offered it would
    have its peers connect to themselves. (The user's own OMPI_MCA_* settings win.)"""
    return {
        "OMPI_MCA_btl_tcp_if_include": interface,
        "OMPI_MCA_oob_tcp_if_include": interface,
        "PRTE_MCA_oob_tcp_if_include": interface,
    }


def cluster_network(ips: list[str]) -> str | None:
    """The smallest IPv4 network holding every address (at most a /31), or None when
    they share less than a /8 or are not IPv4."""
    try:
        addresses = [ipaddress.IPv4Address(ip) for ip in ips]
    except ValueError:
        return None
    for prefix in range(31, 7, -1):
        nets = {ipaddress.IPv4Network(f"{a}/{prefix}", strict=False) for a in addresses}
        if len(nets) == 1:
            return str(nets.pop())
    return None


def loopback_nodes(addresses: dict[str, str]) -> bool:
    """Some instance's node address is a loopback one (a one-machine Ray cluster): no
    interface's own address, so Open MPI can neither select nor advertise it."""
    return any(ip.startswith("127.") for ip in addresses.values())


def cluster_mca(addresses: dict[str, str]) -> dict[str, str]:
    """Open MPI on a Ray cluster: one network, the same on every node, holding every
    instance's address, for the TCP BTL and the out-of-band channel, so each process
    advertises and uses only its node's cluster address (the one the bind shim makes it
    listen on), not loopback or the node's other networks. Identical on every node
    because prterun copies its own ``oob_tcp_if_include`` onto each remote prted's command
    line. One network, not a list of ``/32``: Open MPI 5.0.11 matches a ``/32`` against
    every interface (its BTL offered 127.0.0.1 to the peers) and prterun segfaults on one;
    a list entry that names no local interface also prints a warning per process.
    Measured in docs/decisions.md. IPv6 is turned off for both (the shim gives an
    IPv6-only wildcard ``::1``, which no peer can reach). Loopback node addresses (a
    one-machine cluster) are no interface's own address, and addresses with no common
    /8 make no useful network: Open MPI is left to choose (it skips loopback)."""
    ips = sorted(set(addresses.values()))
    if not ips or loopback_nodes(addresses):
        return {}
    network = cluster_network(ips)
    if network is None:
        return {}
    return {
        "OMPI_MCA_btl_tcp_if_include": network,
        "OMPI_MCA_oob_tcp_if_include": network,
        "PRTE_MCA_oob_tcp_if_include": network,
        "OMPI_MCA_btl_tcp_disable_family": "6",
        "PRTE_MCA_oob_tcp_disable_ipv6_family": "1",
    }


def rank_python_path(env: dict[str, str], kind: str | None = None) -> dict[str, str]:
    """Add the ``horovod`` shim to PYTHONPATH when no real Horovod is importable, and for
    ``smdistributed.dataparallel`` (the TensorFlow estimator) the ``smdistributed`` shim,
    unless SHIPYARD_SMDDP_SHIM=off (as the torch_distributed runner does)."""
    if kind == SMDDP_KIND and settings.get(SMDDP_SHIM_ENV) != "off":
        env = dict(env)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("PYTHONPATH"), ddp_shim_path()) if p
        )
    if importlib.util.find_spec("horovod") is not None:
        return env
    # = shipyard.horovod.shim_path(), without importing numpy and the engine into the agent
    shim = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "horovod",
        "_shim",
    )
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), shim) if p)
    return env


def rank_command(user_command: list[str]) -> list[str]:
    """``python x.py`` -> ``python -m mpi4py x.py`` (also ``-m module``), as the toolkit."""
    if (
        len(user_command) > 1
        and os.path.basename(user_command[0]).startswith("python")  # this or the job's env
        and user_command[1] != "-c"
        and importlib.util.find_spec("mpi4py") is not None
    ):
        return [user_command[0], "-m", "mpi4py", *user_command[1:]]
    return list(user_command)


def plan(ctx: InstanceContext) -> list[ProcessSpec]:
    config = ctx.config
    options = MpiRules().restore(config.runner_options, len(config.hosts), config.num_gpus)
    env = rank_python_path(ctx.env, options.kind)
    if config.sandboxed:
        env = {**sandbox_mca(config.network_interface_name), **env}
    elif config.sandbox.decided_on_node:  # Ray
        env = {**cluster_mca(config.addresses), **env}
        if loopback_nodes(config.addresses) and bindshim.ADDRESS_ENV in env:
            # node addresses Open MPI cannot advertise (loopback: a one-machine cluster):
            # moved listeners would be unreachable at what it offers, so MPI keeps them
            env = bindshim.without(env)
            if ctx.host == config.hosts[0]:
                ctx.notes.append(
                    "mpi: Open MPI's listeners stay on wildcard addresses: the nodes' "
                    "addresses are no interface's own (loopback), so Open MPI could not "
                    "offer them"
                )
    os.makedirs(ctx.paths.agent_dir, exist_ok=True)
    _write_private_json(os.path.join(ctx.paths.agent_dir, ENV_FILE), env)
    python = sys.executable
    # Ray sets SHIPYARD_MPI_LAUNCH=rsh; in instance sandboxes every instance is its own
    # machine too: its ranks must run inside its namespaces (its /opt/ml, its network)
    remote = env.get("SHIPYARD_MPI_LAUNCH") == "rsh" or config.sandboxed
    if ctx.host != config.hosts[0]:
        if remote:
            return [_rsh_server(ctx, env)]
        return [
            ProcessSpec(
                name="mpi-wait",
                argv=[python, "-m", "shipyard.mpi.launch", "--wait"],
                env=env,
                cwd=ctx.paths.code,
                user_facing=False,
            )
        ]

    ppn = options.processes_per_host
    agent_dir = ctx.paths.agent_dir
    failure_file = os.path.join(agent_dir, FAILURE_FILE)
    run_dir = os.path.join(agent_dir, RUN_DIR)
    if os.path.exists(failure_file):  # a retried attempt starts clean
        os.remove(failure_file)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    plan_file = os.path.join(agent_dir, PLAN_FILE)
    _write_private_json(
        plan_file,
        {
            "hosts": list(config.hosts),
            "processes_per_host": ppn,
            "instances_dir": config.instances_dir,
            "env_file": ENV_FILE,
            "master_env": os.path.join(agent_dir, ENV_FILE),
            "failure_file": failure_file,
            "run_dir": run_dir,
            "env_timeout": ENV_TIMEOUT_S,
            "init_timeout": settings.number("SHIPYARD_HOROVOD_INIT_TIMEOUT", env),
            # a retried attempt: ranks wait for the other agents' env of *this* attempt (an older
            # file means that agent is still re-staging its code dir)
            "attempt": env.get("SHIPYARD_ATTEMPT", ""),
            **(
                {
                    "rsh": {
                        "port": mpi_rsh.port(env),
                        "secret": config.job_secret,
                        "self": config.addresses[ctx.host],
                    }
                }
                if remote
                else {}
            ),
        },
    )
    nccl_debug, extra = mpi_command.parse_custom_mpi_options(options.custom_mpi_options)
    if remote:
        extra = [*_rsh_launch_args(ctx, plan_file, ppn), *extra]
    program = [
        python,
        "-m",
        "shipyard.mpi.rank",
        "--plan",
        plan_file,
        "--",
        *rank_command(ctx.user_command),
    ]
    np = ppn * len(config.hosts)
    mpirun = mpi_command.mpirun_command(
        program,
        np,
        mpirun=mpi_command.find_mpirun(env),
        env_vars={"NCCL_DEBUG": nccl_debug},
        extra_args=extra,
    )
    ctx.notes.append(
        f"mpi: {np} ranks ({ppn} per instance x {len(config.hosts)} instances) "
        "started by mpirun on this instance"
    )
    argv = [
        python,
        "-m",
        "shipyard.mpi.launch",
        "--failure-file",
        failure_file,
        "--",
        *mpirun,
    ]
    return [
        ProcessSpec(
            name="mpirun",
            argv=argv,
            env=mpi_command.launcher_env(env),
            cwd=ctx.paths.code,
            failure_file=failure_file,
        )
    ]


def _rsh_server(ctx: InstanceContext, env: dict[str, str]) -> ProcessSpec:
    """A serving instance: the master's mpirun asks it (mpi_rsh) to start prted here."""
    agent_dir = ctx.paths.agent_dir
    serve_file = os.path.join(agent_dir, "mpi-rsh.json")
    _write_private_json(
        serve_file,
        {
            "ip": ctx.config.addresses[ctx.host],
            "port": mpi_rsh.port(env),
            "secret": ctx.config.job_secret,
            "agent_dir": agent_dir,
            "env_file": os.path.join(agent_dir, ENV_FILE),
            "instances_dir": ctx.config.instances_dir,
            "failure_file": os.path.join(agent_dir, FAILURE_FILE),
            "run_dir": _serving_run_dir(ctx, agent_dir),
            "cwd": ctx.paths.code,
        },
    )
    return ProcessSpec(
        name="mpi-rsh",
        argv=[sys.executable, "-m", "shipyard.mpi.rsh", "--serve", serve_file],
        env=mpi_command.launcher_env(env),
        cwd=ctx.paths.code,
        user_facing=False,
    )


def _serving_run_dir(ctx: InstanceContext, agent_dir: str) -> str:
    """Where this instance's ranks leave their init markers. In sandboxes the instances
    share the host's filesystem, so they use the master's run dir at its host path and
    rank 0's init watch sees every rank (on Ray each node keeps its own)."""
    if ctx.config.sandboxed:
        return os.path.join(ctx.config.instances_dir, ctx.config.hosts[0], "agent", RUN_DIR)
    return os.path.join(agent_dir, RUN_DIR)


def _rsh_launch_args(ctx: InstanceContext, plan_file: str, ppn: int) -> list[str]:
    """mpirun options that start prted on the other instances through mpi_rsh, not ssh."""
    agent = os.path.join(ctx.paths.agent_dir, "mpi-rsh-agent")
    with open(agent, "w", encoding="utf-8") as fh:
        fh.write(
            f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m shipyard.mpi.rsh "
            f'--plan {shlex.quote(plan_file)} "$@"\n'
        )
    os.chmod(agent, 0o700)
    ips = [ctx.config.addresses[h] for h in ctx.config.hosts]
    args = [
        "--prtemca",
        "plm_ssh_agent",
        agent,
        "--prtemca",
        "plm_ssh_no_tree_spawn",
        "1",
        "--host",
        ",".join(f"{ip}:{ppn}" for ip in ips),
    ]
    if all(ip.startswith("127.") for ip in ips):
        # one machine (a test cluster): every prted reports the same hostname, and the
        # hierarchical collectives (han) then take ranks of different nodes for neighbours
        args += ["--mca", "coll", "^han"]
    return args


class MpiRunner(MpiRules):
    def plan(self, ctx: InstanceContext) -> list[ProcessSpec]:
        return plan(ctx)
