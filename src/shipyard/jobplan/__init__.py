"""The job's contract between the control plane, the backends and the agent.

``plan.JobPlan``: a job's facts derived from its spec once, at submission (the instance
type resolved, the distribution's runner and its options typed, ``options``, by the
runner's rules, ``runners``; the deciding hosts, the sandbox plan, the framework
environment). ``config.AgentConfig`` is the plan's projection every agent reads (one
agent.json); with it, how an instance is contained (``config_sandbox.SandboxPlan``), the
instance tree (``layout``), what a job's processes keep of the environment that started
them (``inherited``), and what a runner plans for an instance (``runner``: the ``Runner``
protocol, ``ProcessSpec``, ``InstanceContext``). On a floor below ``control``,
``backends`` and ``agent`` so all three read one definition and none imports another's
internals for it; it imports none of them.
"""
