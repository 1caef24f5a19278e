"""JobPlans for unit tests: what ``jobplan.plan.build`` derives, without this machine's
checks (TensorFlow installed, mpirun found, the sandbox probe), so a test of the plan's
projection runs the same everywhere in milliseconds."""

from __future__ import annotations

from shipyard import instance_types
from shipyard.environments import job as framework_envs
from shipyard.jobplan.config_sandbox import SandboxPlan
from shipyard.jobplan.plan import JobPlan
from shipyard.jobplan.runners import RULES
from shipyard.spec import JobSpec


def plan_of(spec: JobSpec, sandbox: SandboxPlan | None = None) -> JobPlan:
    dist = spec.dist
    runner = dist.runner_for(spec.framework)
    resources = instance_types.resolve(spec.instance_type)
    rules = RULES[runner]()
    options = rules.restore(
        dict(dist.options, kind=dist.kind), spec.instance_count, resources.num_gpus
    )
    return JobPlan(
        spec=spec,
        resources=resources,
        distribution=dist,
        options=options,
        deciding_hosts=tuple(rules.deciding_hosts(options, spec.hosts)),
        sandbox=sandbox or SandboxPlan(),
        framework_env=framework_envs.Prepared(None, None, None),
    )
