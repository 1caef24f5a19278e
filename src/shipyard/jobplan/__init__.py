"""The job's contract between the control plane, the backends and the agent.

What the control plane decides about a job and every agent of it reads: the agent's
configuration (``config.AgentConfig``, one agent.json), how an instance is contained
(``config_sandbox.SandboxPlan``), the instance tree (``layout``), what a job's processes
keep of the environment that started them (``inherited``), and what a runner plans for
an instance (``runner``). On a floor below ``control``, ``backends`` and ``agent`` so all
three read one definition and none imports another's internals for it; it imports none
of them.
"""
