"""``python -m shipyard.agent --config agent.json --host algo-k``: run one instance.

Exit status: 0 when the instance succeeded (``output/success`` written), the failing
process's status otherwise (``output/failure`` holds the reason, as in SageMaker).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tarfile
import threading
import time
import traceback
from typing import Any

from shipyard import settings
from shipyard.agent import channels, runners
from shipyard.agent.entry_point import python_dir, user_command
from shipyard.agent.environment import process_env
from shipyard.agent.processes import Outcome, Supervisor
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.layout import InstancePaths, build_tree, paths_for
from shipyard.jobplan.runner import InstanceContext, ProcessSpec
from shipyard.runtime import commandline, failure, safepath
from shipyard.runtime.lifeline import arm_death_signal

OPT_ML = "/opt/ml"
NO_SANDBOX_NOTE = (
    "instance sandbox off ({reason}): /opt/ml is not mapped (SM_* paths point into the "
    "job directory) and the job's listeners are visible on this machine"
)

# Ray: an instance's peers are other machines, reached over the node's own network, and
# nothing yet confines that network to them (issue 31)
NODE_NETWORK_ISOLATION_NOTE = (
    "network isolation: a Ray instance keeps its node's network (its peers are other "
    "machines), so enable_network_isolation is not enforced on Ray; run the job on the "
    "local backend where it must hold"
)


def log(message: str) -> None:
    sys.stdout.write(f"[shipyard-agent] {message}\n")
    sys.stdout.flush()


def stage_code(submit_directory: str, code_dir: str) -> None:
    """Extract sourcedir.tar.gz (or copy a directory) into a clean code dir."""
    if os.path.isdir(code_dir):
        shutil.rmtree(code_dir)
    os.makedirs(code_dir)
    source = submit_directory.removeprefix("file://")
    if os.path.isdir(source):
        shutil.copytree(source, code_dir, dirs_exist_ok=True, symlinks=True)
        return
    with tarfile.open(source, "r:*") as tar:
        tar.extractall(code_dir, filter="data")


def write_file(paths: InstancePaths, path: str, text: str) -> None:
    """Replace a file of the instance's tree, which the job writes too: no link the job
    planted there is followed (shipyard.runtime.safepath)."""
    safepath.write_text(paths.base, path, text)


def own_failure_text(spec: ProcessSpec | None, paths: InstancePaths) -> str | None:
    """The failure text a process wrote itself (ProcessSpec.failure_file), if any: read
    from the instance's tree without following a link the job planted there."""
    if spec is None or not spec.failure_file:
        return None
    try:
        text = safepath.read_text(paths.base, spec.failure_file, failure.LIMIT * 4).strip()
    except (OSError, ValueError):  # absent, a link, or not in the tree
        return None
    return text[: failure.LIMIT] or None


def enter_sandbox(
    config: AgentConfig, host: str, holder_pid: int | None
) -> tuple[InstancePaths, Any]:
    """Move into the instance's namespaces when the job has them. Returns the tree's paths
    as this instance's processes see them (/opt/ml in a sandbox) and the sandbox (an
    InstanceSandbox, None without one)."""
    real = paths_for(config, host)
    plan = config.sandbox
    if holder_pid is None and not config.mounted:
        if plan.reason and (host == config.hosts[0] or plan.decided_on_node):
            log(NO_SANDBOX_NOTE.format(reason=plan.reason))
        if plan.network and host == config.hosts[0]:
            log("shipyard:network: shaping needs the instance sandbox: the job runs unshaped")
        return real, None
    from shipyard.sandbox.instance import InstanceSandbox, enter, enter_without_network

    os.makedirs(real.base, exist_ok=True)
    if holder_pid is None:  # Ray: the node's own network; the rest as on the local backend
        box = InstanceSandbox(
            holder_pid=None,
            host=host,
            hosts=dict(config.addresses),
            tree=real.base,
            rootless=plan.rootless,
        )
        enter_without_network(box)
        if plan.isolation:  # each node decides: each instance says it
            box.missing.append(NODE_NETWORK_ISOLATION_NOTE)
            log(f"{host}: protection missing: {NODE_NETWORK_ISOLATION_NOTE}")
        if plan.network and host == config.hosts[0]:
            log("shipyard:network: shaping needs the job's own network: the job runs unshaped")
        return InstancePaths(OPT_ML), box
    box = InstanceSandbox(
        holder_pid=holder_pid,
        host=host,
        hosts=dict(config.addresses),
        tree=real.base,
        rootless=plan.rootless,
        outbound=not plan.isolation,
        forward_ports=loopback_ports(config),
        shape=_shape(plan.network),
    )
    enter(box)  # its network follows (connect_sandbox), once its init has begun
    return InstancePaths(OPT_ML), box


def connect_sandbox(config: AgentConfig, host: str, box: Any) -> None:
    """The instance's network on the job's bridge (shipyard.sandbox.instance.connect),
    after ``enter`` and the init's start: the init builds the view meanwhile."""
    from shipyard.sandbox.instance import connect

    connect(box)
    if box.shape is not None and host == config.hosts[0]:
        from shipyard.sandbox import shaping

        log(f"{shaping.TAG}: every instance's link shaped to {box.shape.describe()}")
    if box.data_net is not None and box.own_net is not None:
        from shipyard.sandbox import datanet

        datanet.route_connections(box.data_net, box.own_net)
    if config.sandbox.isolation and host == config.hosts[0]:
        log(
            "network isolation: instances have no network beyond the job's; "
            "the agents transfer channels, checkpoints and the model"
        )


def _shape(network: Any) -> Any:
    """The shipyard:network tag's link (shipyard.sandbox.shaping, imported only then)."""
    if not network:
        return None
    from shipyard.sandbox import shaping

    return shaping.Shape.from_json(network)


def loopback_ports(config: AgentConfig) -> list[int]:
    """Ports of the host's loopback a sandboxed instance must still reach: the job's S3
    endpoint when it is on this machine (http://127.0.0.1:9000, localhost, [::1])."""
    ports = set()
    env = config.environment
    for url in (
        config.data.get("endpoint_url"),
        env.get("AWS_ENDPOINT_URL_S3"),
        env.get("AWS_ENDPOINT_URL"),
    ):
        if not url:
            continue
        where = url_host_port(str(url))
        if where is not None and where[0] in ("127.0.0.1", "localhost", "::1"):
            ports.add(where[1])
    return sorted(ports)


def url_host_port(url: str) -> tuple[str, int] | None:
    """(host, port) of ``scheme://[user@]host[:port][/...]`` as urllib.parse.urlsplit reads
    them (the scheme's default port; an IPv6 host in brackets, given without them), or
    None for a port that is not a number. By hand: importing urllib.parse was 2-8 ms of
    every sandboxed agent's start, for this alone."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rpartition("@")[2]
    if netloc.startswith("["):
        host, _, after = netloc[1:].partition("]")
        port_text = after[1:] if after.startswith(":") else ""
    else:
        host, _, port_text = netloc.partition(":")
    default = 443 if scheme.lower() == "https" else 80
    if not port_text:
        return host.lower(), default
    if not port_text.isdigit() or int(port_text) > 65535:
        return None
    return host.lower(), int(port_text)


def sandboxed_specs(
    config: AgentConfig,
    specs: list[ProcessSpec],
    services: list[ProcessSpec],
    box: Any,
    host: str,
    spare: list[int],
    starting: Any = None,
) -> tuple[list[ProcessSpec], list[ProcessSpec], Any]:
    """The job's processes in the instance's own PID namespace (shipyard.sandbox.pidns;
    its init joins ``spare``: it outlives the teardown; the third value is what the
    supervisor starts each process through), without privileges and under the seccomp
    filter (shipyard.sandbox.confine.launch); with network isolation the Pipe feeders run in the
    agent's data network (shipyard.sandbox.datanet), where S3 is, and the job's processes
    in the instance's, where it is not."""
    from dataclasses import replace

    from shipyard.sandbox import confine, datanet, fsview, pidns, seccomp

    namespace, missing = pidns.finish(starting or begin_init(config))
    for note in missing:
        log(f"{host}: protection missing: {note}")
    box.missing.extend(missing)
    if namespace is not None:
        spare.append(namespace.init.pid)
    # /tmp is the instance's own, as a SageMaker container's: no TMPDIR (one the agent
    # inherited names a host directory the view does not have)
    own_tmp = namespace is not None and not any(
        m.startswith(f"filesystem: {fsview.PRIVATE_TMP} ") for m in missing
    )
    tmp = {} if own_tmp else {"TMPDIR": private_tmp(InstancePaths(OPT_ML))}
    specs = [replace(s, env={**_without(s.env, "TMPDIR"), **tmp}) for s in specs]
    # one launcher exec per process: the view, no privileges, the seccomp filter, and
    # the job's environment only at the job's own exec (shipyard.sandbox.launch)
    bpf, lacking = seccomp.build()
    if lacking:
        log(f"{host}: protection missing: {lacking}")
        box.missing.append(lacking)
    mount_ns = namespace.mount_ns if namespace is not None else None
    confined: list[ProcessSpec] = []
    for spec in specs:
        argv, env = confine.launch(spec.argv, spec.env, spec.cwd, mount_ns, bpf)
        confined.append(replace(spec, argv=argv, env=env))
    if box.data_net is not None:
        services = [replace(s, argv=datanet.enter_argv(box.data_net, s.argv)) for s in services]
    return confined, services, namespace.spawn if namespace is not None else _start


def early_init(config: AgentConfig, host: str) -> Any:
    """The instance's init begun now, or None where a channel will mount something the
    view must hold (FastFile): ``sandboxed_specs`` begins it then."""
    return None if channels.mounts_anything(config, host) else begin_init(config)


def begin_init(config: AgentConfig) -> Any:
    """The instance's init on its way (``pidns.begin``), building the job's view."""
    from shipyard.sandbox import fsview, pidns

    return pidns.begin(instance_view(config, fsview.view(config)))


def instance_view(config: AgentConfig, view: dict[str, Any]) -> dict[str, Any]:
    """The filesystem view (shipyard.sandbox.fsview) with what the sandbox plan adds: its
    ``hidden`` directories masked (a Ray node's work dir, the submitter's home) and, where
    the instance's listeners go through the bind shim, the shim itself kept readable (it
    is built under the user's cache, in the masked home)."""
    plan = config.sandbox
    view = {key: list(v) if isinstance(v, list) else v for key, v in view.items()}
    hidden = [os.path.realpath(p) for p in plan.hidden]
    view["mask"] = view.get("mask", []) + [p for p in hidden if p not in view.get("mask", [])]
    # hidden wins over a path the spec names (a probe handed the submitter's home, say);
    # the instance's own tree inside the node's hidden work dir stays
    from shipyard.sandbox import fsview

    named = {os.path.realpath(p) for p in fsview.named_paths(config)}
    for key in ("keep_rw", "keep_ro"):
        view[key] = [
            p
            for p in view.get(key, [])
            if not any(fsview.nested(h, p) or (p in named and fsview.nested(p, h)) for h in hidden)
        ]
    if plan.node_address:
        from shipyard.sandbox import bindshim

        shim = bindshim.build().path
        if shim is not None:
            view["keep_ro"] = view.get("keep_ro", []) + [os.path.realpath(shim)]
    return view


def _without(env: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != name}


def _start(start: Any) -> Any:
    return start()


def run_instance(
    config: AgentConfig,
    host: str,
    log_path: str | None,
    paths: InstancePaths | None = None,
    box: Any = None,
) -> int:
    paths = build_tree(config, host, paths)
    # the instance's init builds its filesystem view while the code and data are staged
    # (on 2 cores, 4 instances: 70-150 ms each that was waited for in turn); a job whose
    # channels mount (FastFile) starts it after them: its view copies the mounts of now
    starting = early_init(config, host) if box is not None else None
    if box is not None and box.holder_pid is not None:
        connect_sandbox(config, host, box)
    stage_code(config.submit_directory, paths.code)
    if box is not None:  # pasta started meanwhile; channels may need the network now
        from shipyard.sandbox.instance import wait_outbound

        wait_outbound(box)
        for note in box.notes:
            log(f"{host}: {note}")
    data = channels.prepare(config, host, paths, log)
    # pasta outlives the user's processes: data.close() uploads through it
    spare = [box.pasta_pid] if box is not None and box.pasta_pid else []
    try:
        return _run(config, host, log_path, paths, data, spare, box, starting)
    finally:
        data.close()


def private_tmp(paths: InstancePaths) -> str:
    """The instance's own temporary directory (``TMPDIR`` of its processes) where its
    filesystem view has no private /tmp, in its tree:
    with a PID namespace per instance, every job's algo-1 would otherwise meet in the
    host's /tmp under the same names (Open MPI's PMIx session directories are named by
    host and pid: mpirun failed with "The PMIx server's listener thread failed to start"),
    and a script's temporary files go with the instance. Short (``/opt/ml/agent/tmp``), as
    the unix sockets made under it need."""
    tmp = os.path.join(paths.agent_dir, "tmp")
    os.makedirs(tmp, mode=0o700, exist_ok=True)  # the job's processes run as the agent's user
    return tmp


def _run(
    config: AgentConfig,
    host: str,
    log_path: str | None,
    paths: InstancePaths,
    data: channels.ChannelSession,
    spare: list[int] | None = None,
    box: Any = None,
    starting: Any = None,
) -> int:
    env = process_env(config, host, paths)
    env["PATH"] = os.pathsep.join(
        p for p in (python_dir(paths.agent_dir, config.python), env.get("PATH")) if p
    )
    bind_address = config.sandbox.node_address
    if bind_address:  # Ray: no wildcard listeners on the node (shipyard.sandbox.bindshim)
        from shipyard.sandbox import bindshim

        env, note = bindshim.environment(env, bind_address)
        log(f"{host}: {note}")
    command = user_command(config, paths.code)
    ctx = InstanceContext(config=config, host=host, paths=paths, env=env, user_command=command)
    specs = runners.get(config.runner).plan(ctx)
    services = data.services()
    spare = list(spare or ())
    spawn: Any = _start
    if box is not None:
        specs, services, spawn = sandboxed_specs(
            config, specs, services, box, host, spare, starting
        )
        if box.missing:
            import json

            write_file(paths, paths.missing_protections_file, json.dumps(box.missing))
    specs += services
    for note in ctx.notes:
        log(note)
    if config.python:
        log(f"{host}: the job's processes run in the framework environment {config.python}")
    for spec in specs:
        log(f"{host}: starting {spec.name} ({spec.role}): {commandline.shown(spec.argv)}")
    recorded: list[bool] = []

    def record_failure(outcome: Outcome) -> None:
        """Before teardown (which may take the stop grace): the failure text, then the
        time its process ended, so the control plane can tell which host failed first."""
        failed = outcome.failed
        text = own_failure_text(failed, paths)
        if text is None:
            output = failure.read_tail(log_path) if log_path else ""
            text = failure.failure_text(
                outcome.exit_code, failed.argv if failed else command, output
            )
        if failed is not None and not failed.user_facing:
            text = f"{failed.name} failed: " + text
        write_file(paths, paths.failure_file, text)
        record_failure_time(outcome.at)
        recorded.append(True)

    time_lock = threading.Lock()

    def record_failure_time(at: float) -> None:
        """From the exit watcher (at once) or the poll loop: the first time stands."""
        with time_lock:
            if not safepath.exists(paths.base, paths.failure_time_file):
                os.makedirs(paths.agent_dir, exist_ok=True)
                try:
                    write_file(paths, paths.failure_time_file, repr(at))
                except OSError as exc:  # a link the job planted: refused, said
                    log(f"{host}: could not record the failure time: {exc}")

    supervisor = Supervisor(
        specs,
        grace=settings.number("SHIPYARD_STOP_GRACE"),
        log=log,
        lost_file=paths.lost_file,
        on_failure=record_failure,
        on_failed_exit=record_failure_time,
        spare=spare or (),
        spawn=spawn,
    )
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    outcome = supervisor.run()
    if outcome.ok:
        write_file(paths, paths.success_file, "")
        return 0
    if outcome.stopped:
        log(f"{host}: stopped by signal {outcome.exit_code - 128}")
        return outcome.exit_code
    if not recorded:
        record_failure(outcome)
    log(
        f"{host}: {outcome.failed.name if outcome.failed else 'process'} exited with "
        f"{failure.describe_exit(outcome.exit_code)}"
    )
    code = outcome.exit_code
    return code if 0 < code < 256 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.agent")
    parser.add_argument("--config", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--log", default=None, help="this agent's own log file (failure text)")
    parser.add_argument("--parent-pid", type=int, default=None, help="die with this process")
    parser.add_argument(
        "--sandbox-holder", type=int, default=None, help="pid holding the job's network"
    )
    args = parser.parse_args(argv)
    if args.parent_pid is not None and not arm_death_signal(args.parent_pid, signal.SIGTERM):
        return 1  # the supervisor died while this agent was starting
    started = time.monotonic()
    config = AgentConfig.load(args.config)
    # this instance's share of the machine's GPUs (backends.resources), when divided
    given = settings.optional_integer("SHIPYARD_INSTANCE_GPUS")
    config.num_gpus = config.num_gpus if given is None else given
    try:
        paths, box = enter_sandbox(config, args.host, args.sandbox_holder)
        code = run_instance(config, args.host, args.log, paths, box)
    except Exception:  # noqa: BLE001 - the agent's own failure: recorded like the toolkit's Framework Error
        text = "Framework Error: \n" + traceback.format_exc()
        paths = InstancePaths(os.path.join(config.instances_dir, args.host))
        try:
            os.makedirs(paths.output, exist_ok=True)
            job_dir = os.path.dirname(config.instances_dir)  # not the job's to rename
            safepath.write_text(job_dir, paths.failure_file, text[-failure.LIMIT :])
        except OSError as exc:  # a link the job planted in its tree: refused
            sys.stdout.write(f"[shipyard-agent] could not write the failure file: {exc}\n")
        sys.stdout.write(text)
        return 1
    log(f"{args.host}: finished with status {code} in {time.monotonic() - started:.2f}s")
    return code


if __name__ == "__main__":
    from shipyard.runtime.quickexit import exit_now

    exit_now(main())  # without the interpreter's teardown: the supervisor waits for it
