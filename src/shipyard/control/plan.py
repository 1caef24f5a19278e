"""From a job's plan and its staged code to what every agent is told (AgentConfig).

Also where the job's addresses are chosen. In an instance sandbox (shipyard.sandbox)
instance algo-k owns 10.X.Y.k on the job's private network. Without one, it gets the
loopback address 127.X.Y.k, with X.Y unique among running jobs, so SageMaker's fixed
ports work for every instance and every concurrent job.
"""

from __future__ import annotations

import os
import random

from shipyard import distribution as dist_mod
from shipyard.control.home import Home
from shipyard.control.staging import StagedCode
from shipyard.errors import ValidationError
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.plan import JobPlan, addresses, region
from shipyard.spec import (
    CHECKPOINT_LOCAL_PATH,
    JobSpec,
    in_instance_tree,
    json_encode_hyperparameters,
)

__all__ = ["addresses", "agent_config", "choose_subnet", "hyperparameters"]


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


def default_model_dir(spec: JobSpec, home: Home) -> str | None:
    """TensorFlow's ``--model_dir``: a directory every instance shares (/opt/ml/shared/model
    in SageMaker local mode); ``model_dir=False`` suppresses it."""
    if spec.framework != "tensorflow" or spec.model_dir is False:
        return None
    if spec.model_dir:
        return spec.model_dir
    return os.path.join(home.job_dir(spec.job_name), "shared", "model")


def hyperparameters(job_plan: JobPlan, staged: StagedCode, home: Home) -> dict[str, str]:
    """hyperparameters.json: the user's plus the SDK's reserved ``sagemaker_*`` keys."""
    spec = job_plan.spec
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
    hps.update(dist_mod.reserved_hyperparameters(job_plan.distribution, spec.instance_type))
    return json_encode_hyperparameters(hps)


def agent_config(
    job_plan: JobPlan,
    staged: StagedCode,
    encoded_hps: dict[str, str],
    home: Home,
    channel_sources: dict[str, str],
    identity: dict[str, str] | None = None,
) -> AgentConfig:
    """What every agent of the job reads: the plan's projection (JobPlan.agent_config) with
    what only the control plane knows, the job's directory and the checkpoint directory
    the instances may see."""
    spec = job_plan.spec
    return job_plan.agent_config(
        staged,
        encoded_hps,
        channel_sources,
        job_dir=home.job_dir(spec.job_name),
        checkpoint_local_path=checkpoint_local_path(spec, home),
        data=data_config(spec),
        identity=identity,
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
