"""JobPlan: a job's facts, derived from its spec once, at submission.

Before this, submission re-derived the same facts at every hop: the instance type was
resolved at eight sites, ``spec.dist`` rebuilt a ``Distribution`` from a dict a dozen
times, the runner's name was chosen three times, and each runner's options stayed an
untyped dict until an agent read them. ``build`` does all of it once, in the order a
refusal must come (the instance family, the runner, its options, the tags' network
shape); the control plane then takes every fact from the plan, and ``agent_config`` is
the plan's projection into what every agent reads (agent.json, unchanged byte for byte).

Nothing here writes or starts anything: a refusal leaves nothing behind.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from shipyard import distribution as dist_mod
from shipyard import instance_types, settings
from shipyard.distribution import Distribution
from shipyard.environments import job as framework_envs
from shipyard.environments.resolver import parse as parse_version
from shipyard.errors import DistributionError, ValidationError
from shipyard.instance_types import InstanceResources
from shipyard.jobplan import config_sandbox
from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.config_sandbox import SandboxPlan
from shipyard.jobplan.options import RunnerOptions
from shipyard.jobplan.runners import PLANNED, RULES
from shipyard.spec import JobSpec

FRAMEWORK_MODULES = {
    "tensorflow": "sagemaker_tensorflow_container.training:main",
    "pytorch": "sagemaker_pytorch_container.training:main",
}
# TensorFlow releases before ParameterServerStrategy's coordinator (2.4) have only the
# TF1 way, every instance running the script in SageMaker's master/worker/ps layout
TF2_PS_SINCE = (2, 4)


class StagedCode(Protocol):
    """What the plan needs of the staged code (``control.staging.StagedCode``)."""

    @property
    def bundle_path(self) -> str: ...
    @property
    def entry_point(self) -> str: ...
    @property
    def extra_python_path(self) -> Sequence[str]: ...
    @property
    def python_package(self) -> bool: ...


@dataclass(frozen=True)
class JobPlan:
    """One job's facts: what its instances are, how it is distributed, where its peers
    are, how its instances are contained and which Python runs its processes."""

    spec: JobSpec
    resources: InstanceResources
    """The instance type, resolved on this machine (the one ``instance_types.resolve`` of
    the submit path)."""
    distribution: Distribution
    options: RunnerOptions
    """The distribution's options, typed for its runner (``options.runner``)."""
    deciding_hosts: tuple[str, ...]
    """The instances whose success ends the job (the runner's rule)."""
    sandbox: SandboxPlan
    framework_env: framework_envs.Prepared
    """The framework environment the job runs in when it is there at submission (the
    installed one, or one that matched); ``env_request`` otherwise."""
    env_request: framework_envs.Request | None = None
    """What the job's first phase prepares before any instance starts (control.envphase)."""
    subnet: str | None = None
    """X.Y of the job's addresses, chosen with the name's reservation (``with_subnet``)."""

    @property
    def runner(self) -> str:
        return self.options.runner

    @property
    def hosts(self) -> list[str]:
        return self.spec.hosts

    @property
    def addresses(self) -> dict[str, str]:
        if self.subnet is None:
            raise ValueError("the plan has no subnet yet: reserve the job's name first")
        return addresses(self.hosts, self.subnet)

    def with_subnet(self, subnet: str) -> JobPlan:
        return replace(self, subnet=subnet)

    def with_spec(self, spec: JobSpec) -> JobPlan:
        """The same plan for the spec as submission completed it (its output_path)."""
        return replace(self, spec=spec)

    def runner_options(self) -> dict[str, Any]:
        """agent.json's ``runner_options`` (``runner_options_for``)."""
        return runner_options_for(self.runner, self.options.raw, self.spec.framework_version)

    def agent_config(
        self,
        staged: StagedCode,
        hyperparameters: dict[str, str],
        channel_sources: dict[str, str],
        job_dir: str,
        checkpoint_local_path: str | None,
        data: dict[str, Any],
        identity: Mapping[str, str] | None = None,
    ) -> AgentConfig:
        """What every agent of the job reads. The job's environment is its spec's and what
        shipyard gives it (``identity``: a credential of its own from `shipyard server`),
        never the submitter's: the agent adds only the essentials (jobplan.inherited)."""
        spec = self.spec
        return AgentConfig(
            job_name=spec.job_name,
            hosts=spec.hosts,
            addresses=self.addresses,
            instance_type=spec.instance_type,
            num_cpus=self.resources.num_cpus,
            num_gpus=self.resources.num_gpus,
            hyperparameters=hyperparameters,
            input_data_config=input_data_config(spec),
            channel_sources=channel_sources,
            submit_directory=staged.bundle_path,
            entry_point=staged.entry_point,
            instances_dir=os.path.join(job_dir, "instances"),
            runner=self.runner,
            runner_options=self.runner_options(),
            framework_module=FRAMEWORK_MODULES.get(spec.framework or ""),
            environment={**spec.environment, **(identity or {})},
            # in a sandbox the instance's interface on the job network is eth0, as on SageMaker
            network_interface_name="eth0" if self.sandbox.sandboxed else "lo",
            extra_python_path=list(staged.extra_python_path),
            python_package=staged.python_package,
            checkpoint_local_path=checkpoint_local_path,
            host_paths=spec.host_paths,
            region=region(),
            log_level=spec.container_log_level,
            shared_dir=os.path.join(job_dir, "shared"),
            job_secret=secrets.token_hex(32),
            data=data,
            sandbox=self.sandbox,
            python=self.framework_env.python,
        )


def build(spec: JobSpec, backend: str) -> JobPlan:
    """The plan of ``spec`` on ``backend``, or the refusal that says what to change: an
    instance family SageMaker does not have, a distribution this build cannot run or
    options its runner rejects, a network-shaping tag that does not parse."""
    custom = settings.text("SHIPYARD_CUSTOM_INSTANCE_FAMILIES").replace(",", " ").split()
    instance_types.check_family(spec.instance_type, frozenset(custom))  # ml.q9.*: refused
    dist = spec.dist
    runner = runner_of(spec, dist)
    resources = instance_types.resolve(spec.instance_type)
    rules = RULES[runner]()
    # the options as the runner gets them on the instances: with the kind, so a runner
    # serving several kinds names the one the user asked for
    options = rules.validate(dict(dist.options, kind=dist.kind), spec.instance_count, resources)
    framework_env, env_request = framework_environment(spec, runner)
    return JobPlan(
        spec=spec,
        resources=resources,
        distribution=dist,
        options=options,
        deciding_hosts=tuple(rules.deciding_hosts(options, spec.hosts)),
        sandbox=sandbox_plan(spec, backend),
        framework_env=framework_env,
        env_request=env_request,
    )


def runner_of(spec: JobSpec, dist: Distribution) -> str:
    """The runner of the job's distribution under its framework, refused when this build
    cannot run it there (never run as plain instead)."""
    runner = dist.runner_for(spec.framework)
    if dist.kind == dist_mod.SMDDP and spec.framework == "tensorflow":
        refusal = dist_mod.smddp_tensorflow_refusal(spec.framework_version)
        if refusal:
            raise DistributionError(refusal)
    if runner == "tf_parameter_server" and spec.framework not in (None, "tensorflow"):
        raise DistributionError(
            "distribution['parameter_server']['implementation']='tensorflow' needs the "
            f"TensorFlow estimator, not {spec.framework!r}; use 'shipyard' (shipyard.ps)"
        )
    if runner not in RULES:
        planned = PLANNED.get(runner, "a later release")
        raise DistributionError(
            f"distribution {dist.kind!r} is recognised but its runner is not available "
            f"in this version of shipyard yet (coming with: {planned}); it will not be run as "
            "a plain job. Remove `distribution` to train without it."
        )
    return runner


def framework_environment(
    spec: JobSpec, runner: str
) -> tuple[framework_envs.Prepared, framework_envs.Request | None]:
    """The framework environment the job's processes run in: the installed one (when
    nothing else is asked, or SHIPYARD_FRAMEWORK_ENVS=off), or a request the job's first
    phase prepares (control.envphase) before any instance starts. Nothing here queries the
    registry or builds: submission returns at once."""
    installed = framework_envs.Prepared(None, None, None)
    if not framework_envs.enabled():
        return installed, None
    matched = framework_envs.installed_match(spec.framework, spec.framework_version)
    if matched is not None:
        return matched, None
    return installed, framework_envs.request(
        spec.framework, spec.framework_version, spec.py_version, runner=runner
    )


def sandbox_plan(spec: JobSpec, backend: str) -> SandboxPlan:
    """The instances' sandbox with the tags' network shape (bad values refused here)."""
    from shipyard.sandbox import shaping

    shape = shaping.from_tags(spec.tags, spec.instance_type)
    sandbox = sandbox_config(backend, spec.enable_network_isolation)
    return sandbox if shape is None else sandbox.with_network(shape.to_json())


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


def addresses(hosts: list[str], subnet: str) -> dict[str, str]:
    if len(hosts) > 253:
        raise ValidationError(f"at most 253 local instances per job, got {len(hosts)}")
    return {host: f"{subnet}.{i}" for i, host in enumerate(hosts, start=1)}


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def input_data_config(spec: JobSpec) -> dict[str, dict[str, Any]]:
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


def runner_options_for(
    runner: str, raw: Mapping[str, Any], framework_version: str | None
) -> dict[str, Any]:
    """The section as written, with its ``kind``. A TensorFlow parameter_server job asking
    for a release before 2.4 gets SageMaker's own layout (``master`` = algo-1, the script
    on every instance) unless it names one: its scripts are TF1 scripts, and the tf2
    layout's coordinator does not exist there (the tf-distribution-options notebook's
    1.13)."""
    options = dict(raw)
    if (
        runner == "tf_parameter_server"
        and "layout" not in options
        and _tf_release(framework_version) < TF2_PS_SINCE
    ):
        options["layout"] = "sagemaker"
    return options


def _tf_release(version: str | None) -> tuple[int, int]:
    """``"1.13"`` -> (1, 13); no version or not a number: the newest (the installed)."""
    v = parse_version(version or "")
    return (v[0], v[1] if len(v) > 1 else 0) if v else (99, 0)
