"""An endpoint's model server in an instance sandbox of its instance type (issue 37).

``python -m shipyard.control.endpoint_box --endpoint-dir D --instance-type T -- <the
arguments of python -m shipyard.serving>`` is what an endpoint runs (control/endpoints.py).
The inference code a training job wrote (``/opt/ml/model/code/inference.py``) is the
job author's code: its workers get what that author's training instance got, from the
same code (no second implementation):

* the master (this process: shipyard's own code, no user code) binds the port in this
  machine's network namespace, then enters mount and UTS namespaces of its own
  (``sandbox.instance.enter_without_network``, the Ray instance's entry: the endpoint's
  tree at ``/opt/ml``, the model at ``/opt/ml/model``);
* the instance type's cgroup (``backends.resources.allot``: CPUs, memory, GPUs, process
  limit), joined by the init and each worker as it starts;
* an init in a PID namespace of the endpoint's own building the training instance's
  filesystem view (``sandbox.pidns``, ``sandbox.init``, ``sandbox.fsview``: the host's
  ``/tmp``, ``$SHIPYARD_HOME``, the homes hidden, a throw-away root);
* each worker born in that namespace, in init's mount namespace, under
  ``sandbox.confine`` (no capability, ``no_new_privs``), with the endpoint's environment
  (the model's ``Environment``: it may hold ``LD_PRELOAD``) applied at the last exec,
  after the privileges are gone; the privileged wrappers run with a fixed environment.

Why the master stays outside: it writes the state file and the log the control plane
reads, which no worker may reach, and it holds no user code. Why the network is shared:
the workers accept on the master's socket, so serving needs nothing more; a namespace of
their own would cut the inference code's outbound network, which SageMaker endpoints
have unless isolated. It is named as a missing protection, as is anything the machine
cannot give (the endpoint still serves).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from shipyard.jobplan import inherited
from shipyard.sandbox import confine, fsview, kernel, pidns, probe
from shipyard.sandbox.instance import OPT_ML, InstanceSandbox, enter_without_network
from shipyard.serving import server
from shipyard.serving.__main__ import parse

if TYPE_CHECKING:
    from shipyard.backends import resources

log = logging.getLogger("shipyard.serving")
HOST = "algo-1"
MODEL_DIR = f"{OPT_ML}/model"
TREE = "instance"  # <endpoint dir>/instance: the endpoint's /opt/ml on the host
ENV_FILE = "environment.json"  # the endpoint's environment, for the workers only
NETWORK_NOTE = (
    "network: the model server's workers share this machine's network namespace (they "
    "serve the endpoint's port from it and keep outbound access): services on this "
    "machine's loopback are reachable from the inference code"
)


def write_env_file(endpoint_dir: str, env: dict[str, str]) -> None:
    """The endpoint's environment, handed to its launcher beside its command line (never
    in the launcher's own environment: it runs privileged)."""
    path = os.path.join(endpoint_dir, ENV_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(env, fh)


def _read_env_file(endpoint_dir: str) -> dict[str, str]:
    path = os.path.join(endpoint_dir, ENV_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    with os.fdopen(fd, encoding="utf-8") as fh:
        env = json.load(fh)
    os.unlink(path)  # secrets of the model's environment stay in no file
    return {str(k): str(v) for k, v in env.items() if k and "=" not in str(k)}


def last_exec(argv: list[str], env: dict[str, str]) -> list[str]:
    """``argv`` with exactly ``env``, set by coreutils ``env -i`` as the last exec of the
    chain (after ``setpriv`` has dropped every privilege)."""
    return ["env", "-i", "--", *(f"{k}={v}" for k, v in env.items()), *argv]


def endpoint_view(tree: str, home: str, keep: list[str], python_path: list[str]) -> dict[str, Any]:
    """A training instance's filesystem view (shipyard.sandbox.fsview) for an endpoint:
    its own tree is at /opt/ml only (not kept at its host path), ``$SHIPYARD_HOME`` is
    hidden, ``keep`` (the metrics directory) stays writable and ``python_path`` (the
    inference code's installed requirements) readable."""
    config = SimpleNamespace(
        instances_dir=os.path.join(tree, "instances"),
        shared_dir=None,
        checkpoint_local_path=None,
        channel_sources={},
        extra_python_path=python_path,
        environment={},
        hyperparameters={},
        python=None,
    )
    view = fsview.view(config)
    own = os.path.realpath(tree)
    view["keep_rw"] = sorted(
        {*(p for p in view["keep_rw"] if not fsview.nested(p, own)), *map(os.path.realpath, keep)}
    )
    hidden = os.path.realpath(home)
    if not any(fsview.nested(hidden, m) for m in view["mask"]):
        view["mask"] = [*view["mask"], hidden]
    return view


class Workers:
    """Starts each worker in the endpoint's sandbox: the ``Launch`` of the master."""

    def __init__(
        self,
        namespace: pidns.ProcessNamespace | None,
        allotment: resources.Allotment | None,
        missing: list[str],
    ) -> None:
        self.namespace = namespace
        self.allotment = allotment
        self.missing = missing

    def __call__(
        self, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...]
    ) -> subprocess.Popen:
        chain, lacking = confine.confined_argv(last_exec(argv, env))
        if lacking and lacking not in self.missing:
            self.missing.append(lacking)
            log.warning("protection missing: %s", lacking)
        if self.namespace is not None:
            chain = self.namespace.enter_argv(chain, MODEL_DIR)

        def start() -> subprocess.Popen:
            return subprocess.Popen(
                chain,
                env={"PATH": os.defpath},  # the privileged wrappers: a fixed environment
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )

        proc = self.namespace.spawn(start) if self.namespace is not None else start()
        if self.allotment is not None:
            self.allotment.join(HOST, proc.pid)
        return proc


def _args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m shipyard.control.endpoint_box")
    p.add_argument("--endpoint-dir", required=True)
    p.add_argument("--home", required=True)
    p.add_argument("--instance-type", default="local")
    p.add_argument("--python-path", action="append", default=[])
    raw = list(sys.argv[1:] if argv is None else argv)
    split = raw.index("--") if "--" in raw else len(raw)
    return p.parse_args(raw[:split]), raw[split + 1 :]


def _enter(endpoint_dir: str, model_dir: str, missing: list[str]) -> bool:
    """Mount and UTS namespaces with the endpoint's tree at /opt/ml and the model at
    /opt/ml/model; False (said in ``missing``) where this machine cannot."""
    support = probe.support(network=False)
    if not support.ok:
        missing.append(
            f"instance sandbox off ({support.reason}): the model server's workers run "
            "as processes of this machine, in its filesystem, with its process table"
            + (f" (fix: {support.fix})" if support.fix else "")
        )
        return False
    tree = os.path.join(endpoint_dir, TREE)
    os.makedirs(os.path.join(tree, "model"), exist_ok=True)
    box = InstanceSandbox(
        holder_pid=None, host=HOST, hosts={HOST: "127.0.0.1"}, tree=tree, rootless=support.rootless
    )
    enter_without_network(box)
    kernel.mount(model_dir, MODEL_DIR, None, kernel.MS_BIND | kernel.MS_REC)
    return True


def _allot(
    args: argparse.Namespace, log_path: str, missing: list[str]
) -> resources.Allotment | None:
    from shipyard import instance_types
    from shipyard.backends import resources  # here: the init builds the view meanwhile

    name = os.path.basename(os.path.normpath(args.endpoint_dir))
    try:
        allotment = resources.allot(
            instance_types.resolve(args.instance_type),
            [HOST],
            f"endpoint-{name}",
            args.endpoint_dir,
            log_path,
        )
    except Exception as exc:  # noqa: BLE001 - the endpoint serves unlimited, and says so
        missing.append(f"limits: no cgroup for {args.instance_type} ({exc})")
        return None
    if allotment.cgroups is None:
        hierarchy = allotment.hierarchy
        missing.append(
            f"limits: no CPU, memory or process limit ({hierarchy.reason})"
            + (f" (fix: {hierarchy.fix})" if hierarchy.fix else "")
        )
    return allotment


def main(argv: list[str] | None = None) -> int:
    args, serving_args = _args(argv)
    config = parse(serving_args)
    logging.basicConfig(level=logging.INFO, format="shipyard-serve: %(message)s")
    env = _read_env_file(args.endpoint_dir)  # read (and removed) whatever happens next
    try:  # first, in this machine's network namespace: a taken port fails at once
        sock = server.bind(config.host, config.port)
    except OSError as exc:
        server.write_state(
            config.state_file, status="Failed", failure_reason=exc.strerror or str(exc)
        )
        log.error("%s", exc.strerror or exc)
        return 2
    config.port = sock.getsockname()[1]
    missing: list[str] = []
    log_path = os.path.join(args.endpoint_dir, "server.log")
    host_model_dir = config.model_dir
    try:
        sandboxed = _enter(args.endpoint_dir, host_model_dir, missing)  # single-threaded here
    except OSError as exc:  # the machine said it could, then refused: say so, serve nothing
        reason = (
            f"the endpoint's instance sandbox could not be set up ({exc}); "
            "SHIPYARD_SANDBOX=off serves it without one"
        )
        server.write_state(config.state_file, status="Failed", failure_reason=reason)
        log.error("%s", reason)
        return 2
    # the workers' /metrics samples (prometheus.make_dir's, without importing asyncio
    # before the init has begun): kept writable in the view, so made before it
    metrics_dir = tempfile.mkdtemp(prefix="shipyard-metrics-")
    starting = None
    if sandboxed:  # the init builds the view while the cgroup is made
        tree = os.path.join(args.endpoint_dir, TREE)
        view = endpoint_view(tree, args.home, [metrics_dir], args.python_path)
        starting = pidns.begin(view)
    allotment = _allot(args, log_path, missing)
    try:
        namespace = None
        if starting is not None:
            namespace, lacking = pidns.finish(starting)
            missing.extend(lacking)
            config.model_dir = MODEL_DIR
            if namespace is not None and allotment is not None:
                allotment.join(HOST, namespace.init.pid)
        missing.append(NETWORK_NOTE)
        for note in missing:
            log.warning("protection missing: %s", note)
        _startup_timeout(env)
        master = server.Master(
            config,
            sock,
            launch=Workers(namespace, allotment, missing),
            base_env=_worker_env(env, args.python_path, allotment),
            metrics_dir=metrics_dir,
            label=host_model_dir,
            missing=missing,
        )
        return master.run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if allotment is not None:
            allotment.release()


def _worker_env(
    env: dict[str, str], python_path: list[str], allotment: resources.Allotment | None
) -> dict[str, str]:
    """What the workers start from: the essentials of this process's environment (as a
    training job's: never the keys of the process that created the endpoint, `shipyard
    server`'s among them; jobplan.inherited), without ``TMPDIR`` (a host directory the view
    does not have), the model's environment, its requirements on ``PYTHONPATH``, and the
    GPUs of its instance type."""
    base = {k: v for k, v in inherited.essentials(os.environ).items() if k != "TMPDIR"}
    base.update(env)
    if python_path:
        base["PYTHONPATH"] = os.pathsep.join(
            [*python_path, *[p for p in [base.get("PYTHONPATH")] if p]]
        )
    return allotment.env(HOST, base) if allotment is not None else base


def _startup_timeout(env: dict[str, str]) -> None:
    """SageMaker's SAGEMAKER_STARTUP_TIMEOUT in the model's environment (read by the
    master, which does not get that environment)."""
    value = env.get("SAGEMAKER_STARTUP_TIMEOUT")
    if value is None:
        return
    try:
        server.READY_TIMEOUT = float(value)
    except ValueError:
        log.warning(
            "SAGEMAKER_STARTUP_TIMEOUT=%r is not a number of seconds; using %.0f",
            value,
            server.READY_TIMEOUT,
        )


if __name__ == "__main__":
    sys.exit(main())
