"""What each instance of a local launch gets of this machine: its type's CPUs (a cpuset),
memory (a hard limit) and GPUs (``CUDA_VISIBLE_DEVICES``), plus a process limit.

The local backend asks :func:`plan` before it starts the agents, creates the cgroups
(``sandbox.cgroups``) and leases the GPUs (``sandbox.gpus``); the plan's summary is
written once to algo-1's log and, with every instance's share, to ``resources.json`` in
the job directory (``describe``'s ``Shipyard.Resources``). ``local``/``local_gpu`` take
the whole machine: no CPU or memory limit, only the process limit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shipyard import instance_types, settings
from shipyard.errors import BackendError
from shipyard.instance_types import InstanceResources
from shipyard.sandbox import cgroups, gpus

RESOURCES_NAME = "resources.json"
# A fork bomb fails its own job: no instance may hold more processes (threads count).
PIDS_MAX_DEFAULT = 4096


def pids_max() -> int:
    return settings.integer("SHIPYARD_PIDS_MAX")


@dataclass
class Plan:
    resources: InstanceResources
    limits: dict[str, cgroups.Limits]
    division: gpus.Division
    notes: list[str] = field(default_factory=list)
    memory_bytes: int | None = None
    machine_gpus: list[str] = field(default_factory=list)

    @property
    def instance_type(self) -> str:
        return self.resources.instance_type

    def summary(self, hierarchy: cgroups.Hierarchy) -> list[str]:
        """The lines algo-1's log shows once."""
        lines = [self.resources.describe()]
        if hierarchy.usable:
            cpus = {h: cgroups.cpu_list(lim.cpus) for h, lim in self.limits.items() if lim.cpus}
            where = f"cpuset {', '.join(f'{h}: {c}' for h, c in cpus.items())}; " if cpus else ""
            lines.append(
                f"limits per instance (cgroup v{hierarchy.version}): {where}memory "
                f"{instance_types.gib(self.memory_bytes)}; at most {pids_max()} processes"
            )
        else:
            lines.append(
                "WARNING: instances run without CPU, memory and process limits: "
                f"{hierarchy.reason}" + (f" (fix: {hierarchy.fix})" if hierarchy.fix else "")
            )
        if any(self.division.gpus.values()):
            lines.append(
                "GPUs: " + ", ".join(f"{h}: {','.join(g)}" for h, g in self.division.gpus.items())
            )
        if any(lim.denied_devices for lim in self.limits.values()):
            note = cgroups.devices_note(hierarchy)
            lines.append(note or "the other instances' GPU devices are denied (cgroup v1 devices)")
        return lines + self.division.notes + self.notes

    def record(self, hierarchy: cgroups.Hierarchy) -> dict[str, Any]:
        """What describe shows: the limits each instance got, or why there are none."""
        return {
            "InstanceType": self.instance_type,
            "Cgroups": f"v{hierarchy.version}" if hierarchy.usable else None,
            "Unlimited": None if hierarchy.usable else hierarchy.reason,
            "Fix": None if hierarchy.usable else hierarchy.fix or None,
            "Instances": {
                host: {
                    "Cpus": list(lim.cpus) or None,
                    "MemoryBytes": lim.memory_bytes,
                    "PidsMax": lim.pids_max,
                    "Gpus": self.division.gpus.get(host, []),
                    "DeniedDevices": list(lim.denied_devices) or None,
                }
                for host, lim in self.limits.items()
            },
            "Notes": self.division.notes + self.notes,
        }


def plan(
    res: InstanceResources,
    hosts: list[str],
    available_cpus: list[int] | None = None,
    available_gpus: list[str] | None = None,
    held_gpus: dict[str, str] | None = None,
    policy: str = gpus.WAIT,
) -> Plan:
    """Pure given its inputs (the machine's CPUs and GPUs default to this machine's).
    ``res``: the instance type as resolved once for the job (AgentConfig.resources)."""
    instance_type = res.instance_type
    if available_cpus is None:
        available_cpus = sorted(os.sched_getaffinity(0))
    if available_gpus is None:
        available_gpus = gpus.devices()
    if res.whole_machine:
        cpu_sets: list[tuple[int, ...]] = [() for _ in hosts]
        per_gpu = len(available_gpus) if instance_type == "local_gpu" else 0
    else:
        cpu_sets = cgroups.cpu_sets(res.nominal_cpus, len(hosts), available_cpus)
        per_gpu = res.nominal_gpus
    if instance_type == "local_gpu":  # every instance sees every GPU, as today
        division = gpus.Division({h: list(available_gpus) for h in hosts})
    else:
        division = gpus.divide(
            hosts, per_gpu, available_gpus, held_gpus, policy, instance_type=instance_type
        )
    limits = {
        host: cgroups.Limits(
            cpus=cpus,
            memory_bytes=res.memory_bytes,
            pids_max=pids_max(),
            # a named type's instance: the machine's GPUs it was not given, denied
            denied_devices=()
            if res.whole_machine
            else tuple(
                gpus.device_rules([g for g in available_gpus if g not in division.gpus[host]])
            ),
        )
        for host, cpus in zip(hosts, cpu_sets, strict=True)
    }
    return Plan(
        res,
        limits,
        division,
        memory_bytes=res.memory_bytes,
        machine_gpus=list(available_gpus),
    )


def write_record(job_dir: str, record: dict[str, Any]) -> None:
    path = os.path.join(job_dir, RESOURCES_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    os.replace(tmp, path)


def read_record(job_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(job_dir, RESOURCES_NAME), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def oom_reason(host: str, instance_type: str, memory_bytes: int | None) -> str:
    """SageMaker's error name, the instance and its limit, and what to do."""
    limit = instance_types.gib(memory_bytes)
    return (
        f"OutOfMemoryError: {host} exceeded its {limit} memory limit ({instance_type}); "
        "the kernel killed its largest process. Use an instance type with more memory or "
        "make the script use less."
    )


def pids_reason(host: str, limit: int | None) -> str:
    return (
        f"{host} reached its limit of {limit} processes and threads (a fork bomb?); "
        "SHIPYARD_PIDS_MAX raises it."
    )


GPU_WAIT_POLL_S = 1.0


class Allotment:
    """One launch's share of the machine: its cgroups and GPU leases, what each
    instance's end revealed (an OOM kill, the process limit), and their release."""

    def __init__(
        self,
        plan: Plan,
        hierarchy: cgroups.Hierarchy,
        job_cgroups: cgroups.JobCgroups | None,
        leases: list[str],
    ) -> None:
        self.plan = plan
        self.hierarchy = hierarchy
        self.cgroups = job_cgroups
        self.leases = leases
        self.verdicts: dict[str, str | None] = {}
        self.released = False

    def env(self, host: str, env: dict[str, str]) -> dict[str, str]:
        """The agent's environment: its GPUs as ``CUDA_VISIBLE_DEVICES`` (none for a
        named CPU type on a machine with GPUs, as on SageMaker)."""
        assigned = self.plan.division.gpus.get(host, [])
        named = self.plan.instance_type not in ("local", "local_gpu")
        if assigned or (named and self.plan.machine_gpus):
            env = dict(
                env,
                CUDA_VISIBLE_DEVICES=",".join(assigned),
                SHIPYARD_INSTANCE_GPUS=str(len(assigned)),  # the agent's SM_NUM_GPUS
            )
        return env

    def join(self, host: str, pid: int) -> None:
        if self.cgroups is not None and host in self.cgroups.instances:
            self.cgroups.instances[host].join(pid)

    def instance_cgroup(self, host: str) -> cgroups.InstanceCgroup | None:
        if self.cgroups is None or self.released:
            return None
        return self.cgroups.instances.get(host)

    def ended(self, host: str) -> None:
        """Read, while the cgroup still exists, whether the kernel ended the instance."""
        if host in self.verdicts:
            return
        cg = self.instance_cgroup(host)
        verdict = None
        if cg is not None:
            if cg.oom_kills():
                verdict = oom_reason(host, self.plan.instance_type, cg.limits.memory_bytes)
            elif cg.pids_refused():
                verdict = pids_reason(host, cg.limits.pids_max)
        self.verdicts[host] = verdict

    def verdict(self, host: str) -> str | None:
        return self.verdicts.get(host)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.cgroups is not None:
            self.cgroups.release()
        gpus.give_back(self.leases)


def allot(
    res: InstanceResources,
    hosts: list[str],
    job: str,
    job_dir: str,
    log_path: str,
    should_stop: Callable[[], bool] = lambda: False,
) -> Allotment:
    """Plan the launch (waiting for GPUs other jobs hold, unless sharing was asked for),
    create its cgroups, lease its GPUs, say what each instance gets (once, in algo-1's
    log) and record it for describe. Without usable cgroups the job runs unlimited."""
    try:
        policy = gpus.sharing_policy()
    except ValueError as exc:
        raise BackendError(str(exc)) from None
    said_wait = False
    while True:
        the_plan = plan(res, hosts, held_gpus=gpus.held(), policy=policy)
        blocked = the_plan.division.blocked
        if not blocked:
            break
        if not said_wait:
            _log(
                log_path,
                [
                    "waiting for GPU(s) "
                    + ", ".join(f"{g} (held by {who})" for g, who in blocked.items())
                    + ": a GPU another job holds is not handed out again; "
                    "SHIPYARD_GPU_SHARING=share shares it instead"
                ],
            )
            said_wait = True
        if should_stop():
            raise InterruptedError("stopped while waiting for GPUs")
        time.sleep(GPU_WAIT_POLL_S)
    hierarchy = cgroups.detect()
    job_cgroups = None
    if hierarchy.usable:
        try:
            job_cgroups = cgroups.create(job, the_plan.limits, hierarchy)
        except OSError as exc:
            hierarchy = cgroups.Hierarchy(
                0, reason=f"the kernel refused this job's cgroups: {exc}", fix=""
            )
    assigned = [g for ids in the_plan.division.gpus.values() for g in ids]
    leases = gpus.take(assigned, job) if assigned else []
    _log(log_path, the_plan.summary(hierarchy))
    try:
        write_record(job_dir, the_plan.record(hierarchy))
    except OSError:
        pass  # describe then shows no Resources; the job itself is unaffected
    return Allotment(the_plan, hierarchy, job_cgroups, leases)


def _log(log_path: str, lines: list[str]) -> None:
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.writelines(f"[shipyard] {line}\n" for line in lines)
