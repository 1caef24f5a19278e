"""The environment a user script sees: every SM_* variable of the training toolkit.

Pure functions of (AgentConfig, host, paths) so tests can compare them with the
toolkit's documented rules without running anything. Mirrors
sagemaker_training.environment.Environment.to_env_vars().
"""

from __future__ import annotations

import os
from typing import Any

from shipyard.agent import mapping
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.layout import GROUP_NAME, InstancePaths, resource_config

_DISTRIBUTION_FLAGS = (
    "sagemaker_mpi_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_torch_distributed_enabled",
)


def module_name(program: str | None) -> str | None:
    """``train.py`` -> ``train`` (toolkit ``_parse_module_name``)."""
    if program and program.endswith(".py"):
        return program[:-3]
    return program


def training_env(config: AgentConfig, host: str, paths: InstancePaths) -> dict[str, Any]:
    """The toolkit's Environment as a dict (what SM_TRAINING_ENV holds)."""
    all_hps = mapping.decode_hyperparameters(config.hyperparameters)
    sm_hps, user_hps = mapping.split_hyperparameters(all_hps)
    framework_params = {
        k: v for k, v in sm_hps.items() if k not in mapping.RESERVED_HYPERPARAMETERS
    }
    rc = resource_config(config, host)
    groups = rc["instance_groups"]
    if "sagemaker_distribution_instance_groups" in framework_params:
        dist_groups = framework_params["sagemaker_distribution_instance_groups"]
    else:
        dist_groups = (
            [GROUP_NAME]
            if any(framework_params.get(flag, False) for flag in _DISTRIBUTION_FLAGS)
            else []
        )
    dist_hosts = [h for g in groups if g["instance_group_name"] in dist_groups for h in g["hosts"]]
    master = dist_hosts[0] if dist_hosts else config.hosts[0]
    program = sm_hps.get("sagemaker_program")
    return {
        "additional_framework_parameters": framework_params,
        "channel_input_dirs": {c: paths.channel(c) for c in config.input_data_config},
        "current_host": host,
        "current_instance_group": GROUP_NAME,
        "current_instance_group_hosts": list(config.hosts),
        "current_instance_type": config.instance_type,
        "distribution_hosts": dist_hosts,
        "distribution_instance_groups": dist_groups,
        "framework_module": config.framework_module,
        "hosts": list(config.hosts),
        "hyperparameters": user_hps,
        "input_config_dir": paths.input_config,
        "input_data_config": config.input_data_config,
        "input_dir": paths.input,
        "instance_groups": [g["instance_group_name"] for g in groups],
        "instance_groups_dict": {g["instance_group_name"]: g for g in groups},
        "is_hetero": len(groups) > 1,
        "is_master": host == master,
        "is_modelparallel_enabled": None,
        "is_smddpmprun_installed": False,
        "job_name": config.job_name,
        "log_level": sm_hps.get("sagemaker_container_log_level", 20),
        "master_hostname": master,
        "model_dir": paths.model,
        "module_dir": str(sm_hps.get("sagemaker_submit_directory", paths.code)),
        "module_name": module_name(str(program) if program is not None else None),
        "network_interface_name": config.network_interface_name,
        "num_cpus": config.num_cpus,
        "num_gpus": config.num_gpus,
        "num_neurons": 0,
        "output_data_dir": paths.output_data,
        "output_dir": paths.output,
        "output_intermediate_dir": paths.output_intermediate,
        "resource_config": rc,
        "user_entry_point": program,
    }


def sm_env_vars(config: AgentConfig, host: str, paths: InstancePaths) -> dict[str, str]:
    """Every SM_* variable, encoded as the toolkit encodes them."""
    env = training_env(config, host, paths)
    user_hps = env["hyperparameters"]
    values: dict[str, Any] = {
        "hosts": env["hosts"],
        "network_interface_name": env["network_interface_name"],
        "hps": user_hps,
        "user_entry_point": env["user_entry_point"],
        "framework_params": env["additional_framework_parameters"],
        "resource_config": env["resource_config"],
        "input_data_config": env["input_data_config"],
        "output_data_dir": env["output_data_dir"],
        "channels": sorted(env["channel_input_dirs"]),
        "current_host": host,
        "current_instance_type": env["current_instance_type"],
        "current_instance_group": env["current_instance_group"],
        "current_instance_group_hosts": env["current_instance_group_hosts"],
        "instance_groups": env["instance_groups"],
        "instance_groups_dict": env["instance_groups_dict"],
        "distribution_instance_groups": env["distribution_instance_groups"],
        "is_hetero": env["is_hetero"],
        "module_name": env["module_name"],
        "log_level": env["log_level"],
        "framework_module": env["framework_module"],
        "input_dir": env["input_dir"],
        "input_config_dir": env["input_config_dir"],
        "output_dir": env["output_dir"],
        "num_cpus": env["num_cpus"],
        "num_gpus": env["num_gpus"],
        "num_neurons": env["num_neurons"],
        "model_dir": env["model_dir"],
        "module_dir": env["module_dir"],
        "training_env": env,
        "user_args": mapping.to_cmd_args(user_hps),
        "output_intermediate_dir": env["output_intermediate_dir"],
    }
    for name, path in env["channel_input_dirs"].items():
        values[f"channel_{name}"] = path
    for key, value in user_hps.items():
        values[f"hp_{key}"] = value
    return mapping.to_env_vars(values)


def framework_env_lib(python: str | None) -> str | None:
    """A framework environment's ``lib`` when it holds Open MPI's library: mpi4py built
    there from source (Python 3.7) finds it through ``LD_LIBRARY_PATH``, its own RUNPATH
    naming the directory it was built in (shipyard.environments.builder)."""
    if not python:
        return None
    lib = os.path.join(os.path.dirname(os.path.dirname(python)), "lib")
    return lib if os.path.exists(os.path.join(lib, "libmpi.so")) else None


def process_env(
    config: AgentConfig, host: str, paths: InstancePaths, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The full environment of the user process: inherited < user's < SageMaker's. What
    is inherited of the agent's own environment is only the essentials
    (shipyard.jobplan.inherited): never the submitter's keys."""
    from shipyard.jobplan.inherited import essentials
    from shipyard.runtime import resolver, sitehooks  # local: keeps the pure part import-light

    env = essentials(os.environ if base is None else base)
    env.update(config.environment)
    sm_hps, _ = mapping.split_hyperparameters(
        mapping.decode_hyperparameters(config.hyperparameters)
    )
    env.update(sm_env_vars(config, host, paths))
    env.update(
        {
            "TRAINING_JOB_NAME": config.job_name,
            "TRAINING_JOB_ARN": f"arn:shipyard:local:training-job/{config.job_name}",
            "SAGEMAKER_JOB_NAME": str(sm_hps.get("sagemaker_job_name", config.job_name)),
            "CURRENT_HOST": host,
            "SAGEMAKER_REGION": config.region,
            "AWS_REGION": env.get("AWS_REGION", config.region),
            "SAGEMAKER_BASE_DIR": paths.base,
            # the instance's tree on the host (SAGEMAKER_BASE_DIR is /opt/ml in a sandbox)
            "SHIPYARD_INSTANCE_DIR": os.path.join(config.instances_dir, host),
            "PYTHONUNBUFFERED": "1",
            # where a distribution's processes leave the placement/traffic report
            "SHIPYARD_REPORT_PATH": paths.report_file,
        }
    )
    if config.framework_module:
        env["SAGEMAKER_TRAINING_MODULE"] = config.framework_module
    from shipyard import ddp, tf  # package paths only: neither imports its framework

    # then the step-timing hooks (issue 39), chained from site_dir's sitecustomize: Keras
    # fit and TF1 sessions (tf/_hook), torch DDP (ddp/_hook), in every job process
    timing_hooks = [os.path.join(os.path.dirname(tf.__file__), "_hook"), ddp.timing_hook_path()]
    python_path = [paths.code, *config.extra_python_path, sitehooks.site_dir(), *timing_hooks]
    # in a sandbox libc itself resolves algo-k (/etc/hosts)
    env[sitehooks.PYTHON_RESOLVER_ENV] = "0" if config.sandboxed else "1"
    if config.input_data_config:  # `from sagemaker_tensorflow import PipeModeDataset`
        from shipyard.data.shims import sagemaker_tensorflow_path

        python_path += [p for p in [sagemaker_tensorflow_path()] if p]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(python_path)
    env.update(resolver.env_for(config.addresses, host))
    env_lib = framework_env_lib(config.python)
    if env_lib:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (env_lib, env.get("LD_LIBRARY_PATH")) if p
        )
    if config.sandboxed:
        # NCCL would also consider pasta's tap0, which has the host's address in every
        # instance; the job network is eth0 (as SageMaker's containers set it)
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env.setdefault(name, config.network_interface_name)
    return env
