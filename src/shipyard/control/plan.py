"""From a JobSpec and its staged code to what every agent is told (AgentConfig).

Also where the job's addresses are chosen. In an instance sandbox (shipyard.sandbox)
instance algo-k owns 10.X.Y.k on the job's private network. Without one, it gets the
loopback address 127.X.Y.k, with X.Y unique among running jobs, so SageMaker's fixed
ports work for every instance and every concurrent job.
"""

from __future__ import annotations

import os
import random
import secrets
from typing import Any

from shipyard import distribution as dist_mod
from shipyard import instance_types
from shipyard.jobplan import config_sandbox
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.config_sandbox import SandboxPlan
from shipyard.control.home import Home
from shipyard.control.staging import StagedCode
from shipyard.environments.resolver import parse
from shipyard.errors import ValidationError
from shipyard.spec import (
    CHECKPOINT_LOCAL_PATH,
    JobSpec,
    in_instance_tree,
    json_encode_hyperparameters,
)

FRAMEWORK_MODULES = {
    "tensorflow": "sagemaker_tensorflow_container.training:main",
    "pytorch": "sagemaker_pytorch_container.training:main",
}


def sandbox_config(backend: str, isolation: bool = False) -> SandboxPlan:
    """AgentConfig.sandbox for a job on ``backend``: on when this machine supports it;
    ``isolation`` (enable_network_isolation) cuts the instances' outbound traffic."""
    from shipyard.sandbox import probe

    if backend != "local":
        # Ray: each node decides for its own instances (shipyard.backends.ray.actor);
        # the instances keep their node's network
        if probe.switched_off():
            return SandboxPlan(config_sandbox.OFF, reason="SHIPYARD_SANDBOX=off")
        return SandboxPlan(config_sandbox.PER_NODE, isolation=bool(isolation))
    support = probe.support()
    return SandboxPlan(
        config_sandbox.JOB_NETWORK if support.ok else config_sandbox.OFF,
        reason=support.reason,
        rootless=support.rootless,
        isolation=bool(isolation),
    )


def choose_subnet(
    in_use: set[str], rng: random.Random | None = None, sandboxed: bool = False
) -> str:
    """X.Y of the job's addresses: 10.X.Y in a sandbox (a private network of the job's
    own, so it need not be unique), else a loopback 127.X.Y not used by a running job."""
    rng = rng or random.Random()
    first = "10" if sandboxed else "127"
    for _ in range(1000):
        subnet = f"{first}.{rng.randint(100, 199)}.{rng.randint(0, 255)}"
        if subnet not in in_use:
            return subnet
    raise ValidationError("no free loopback subnet for a new job; too many jobs running")


def addresses(hosts: list[str], subnet: str) -> dict[str, str]:
    if len(hosts) > 253:
        raise ValidationError(f"at most 253 local instances per job, got {len(hosts)}")
    return {host: f"{subnet}.{i}" for i, host in enumerate(hosts, start=1)}


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def default_model_dir(spec: JobSpec, home: Home) -> str | None:
    """TensorFlow's ``--model_dir``: a directory every instance shares (/opt/ml/shared/model
    in SageMaker local mode); ``model_dir=False`` suppresses it."""
    if spec.framework != "tensorflow" or spec.model_dir is False:
        return None
    if spec.model_dir:
        return spec.model_dir
    return os.path.join(home.job_dir(spec.job_name), "shared", "model")


def hyperparameters(spec: JobSpec, staged: StagedCode, home: Home) -> dict[str, str]:
    """hyperparameters.json: the user's plus the SDK's reserved ``sagemaker_*`` keys."""
    hps = dict(spec.hyperparameters)
    model_dir = default_model_dir(spec, home)
    if model_dir is not None and "model_dir" not in hps:
        hps["model_dir"] = model_dir
    hps.update(
        {
            "sagemaker_program": staged.entry_point,
            "sagemaker_submit_directory": staged.bundle_uri,
            "sagemaker_container_log_level": spec.container_log_level,
            "sagemaker_job_name": spec.job_name,
            "sagemaker_region": region(),
        }
    )
    hps.update(dist_mod.reserved_hyperparameters(spec.dist, spec.instance_type))
    return json_encode_hyperparameters(hps)


def input_data_config(spec: JobSpec) -> dict[str, dict[str, str]]:
    out = {}
    for ch in spec.channels:
        entry = {}
        if ch.content_type:
            entry["ContentType"] = ch.content_type
        entry.update(
            {
                "TrainingInputMode": spec.channel_mode(ch),
                "S3DistributionType": ch.distribution,
                "RecordWrapperType": ch.record_wrapping or "None",
            }
        )
        if ch.compression:
            entry["CompressionType"] = ch.compression
        out[ch.name] = entry
    return out


# TensorFlow releases before ParameterServerStrategy's coordinator (2.4) have only the
# TF1 way, every instance running the script in SageMaker's master/worker/ps layout
TF2_PS_SINCE = (2, 4)


def runner_options(spec: JobSpec) -> dict[str, Any]:
    """The distribution's options for its runner. A TensorFlow parameter_server job asking
    for a release before 2.4 gets SageMaker's own layout (``master`` = algo-1, the script on
    every instance) unless it names one: its scripts are TF1 scripts, and the tf2 layout's
    coordinator does not exist there (the tf-distribution-options notebook's 1.13)."""
    dist = spec.dist
    options = dict(dist.options, kind=dist.kind)
    if (
        dist.runner_for(spec.framework) == "tf_parameter_server"
        and "layout" not in options
        and _tf_release(spec.framework_version) < TF2_PS_SINCE
    ):
        options["layout"] = "sagemaker"
    return options


def _tf_release(version: str | None) -> tuple[int, int]:
    """``"1.13"`` -> (1, 13); no version or not a number: the newest (the installed)."""
    v = parse(version or "")
    return (v[0], v[1] if len(v) > 1 else 0) if v else (99, 0)


def agent_config(
    spec: JobSpec,
    staged: StagedCode,
    encoded_hps: dict[str, str],
    home: Home,
    subnet: str,
    channel_sources: dict[str, str],
    sandbox: SandboxPlan | None = None,
    python: str | None = None,
    identity: dict[str, str] | None = None,
) -> AgentConfig:
    """What every agent of the job reads. The job's environment is its spec's and what
    shipyard gives it (``identity``: a credential of its own from `shipyard server`),
    never the submitter's: the agent adds only the essentials (shipyard.jobplan.inherited)."""
    res = instance_types.resolve(spec.instance_type)
    dist = spec.dist
    return AgentConfig(
        job_name=spec.job_name,
        hosts=spec.hosts,
        addresses=addresses(spec.hosts, subnet),
        instance_type=spec.instance_type,
        num_cpus=res.num_cpus,
        num_gpus=res.num_gpus,
        hyperparameters=encoded_hps,
        input_data_config=input_data_config(spec),
        channel_sources=channel_sources,
        submit_directory=staged.bundle_path,
        entry_point=staged.entry_point,
        instances_dir=os.path.join(home.job_dir(spec.job_name), "instances"),
        runner=dist.runner_for(spec.framework),
        runner_options=runner_options(spec),
        framework_module=FRAMEWORK_MODULES.get(spec.framework or ""),
        environment={**spec.environment, **(identity or {})},
        # in a sandbox the instance's interface on the job network is eth0, as on SageMaker
        network_interface_name="eth0" if sandbox is not None and sandbox.sandboxed else "lo",
        extra_python_path=list(staged.extra_python_path),
        python_package=staged.python_package,
        checkpoint_local_path=checkpoint_local_path(spec, home),
        host_paths=spec.host_paths,
        region=region(),
        log_level=spec.container_log_level,
        shared_dir=os.path.join(home.job_dir(spec.job_name), "shared"),
        job_secret=secrets.token_hex(32),
        data=data_config(spec),
        sandbox=sandbox or SandboxPlan(),
        python=python,
    )


def checkpoint_local_path(spec: JobSpec, home: Home) -> str | None:
    """The job's checkpoint directory for its agents: a path in the instance's tree
    (``/opt/ml/...``, each instance's own), or a directory of this machine the SDK's or
    CLI's user named for the instances to share, unless the instances may not see it (a
    shipyard home, the users' homes: shipyard.sandbox.fsview.hidden); then None, and each
    instance checkpoints to its own ``/opt/ml/checkpoints`` (``checkpoint_note`` says so)."""
    from shipyard.sandbox import fsview

    path = spec.checkpoint_local_path
    if path is None or in_instance_tree(path):
        return path
    if not spec.host_paths or fsview.hidden(path, [home.root]):
        return None
    return path


def checkpoint_note(spec: JobSpec, home: Home) -> str | None:
    """Why a named checkpoint_local_path is not the host directory the instances share."""
    path = spec.checkpoint_local_path
    if path is None or in_instance_tree(path) or checkpoint_local_path(spec, home) is not None:
        return None
    return (
        f"checkpoint_local_path {path} is hidden from instances (a shipyard home or a "
        "user's home, or holds one): it is not bound into them; each instance checkpoints "
        f"to its own {CHECKPOINT_LOCAL_PATH}. To keep checkpoints across jobs, give "
        "checkpoint_s3_uri (a file:// directory works), as on SageMaker."
    )


def data_config(spec: JobSpec) -> dict:
    """What the agents' channel code needs beyond inputdataconfig.json (AgentConfig.data)."""
    from shipyard import storage

    return {
        "endpoint_url": storage.endpoint_url(),
        "data_types": {ch.name: ch.s3_data_type for ch in spec.channels},
        "checkpoint_uri": (
            storage.parse(spec.checkpoint_s3_uri).uri if spec.checkpoint_s3_uri else None
        ),
        "tensorboard": (
            {
                "uri": storage.parse(spec.tensorboard.output_uri(spec.job_name)).uri,
                "local_path": spec.tensorboard.local_path,
            }
            if spec.tensorboard
            else None
        ),
    }
