"""A finished job's measurements (its describe output) -> a :class:`Profile` to plan from.

What shipyard records and what is read from it:

- the distribution (``Shipyard.Distribution``) and the framework pick the model's row kind;
- the distribution report (``Shipyard.DistributionReport``, parameter-server jobs): the
  variables' bytes in creation order, the placement policy, the consistency mode, the
  wire bytes each worker sent each server (for the framing overhead) and the push count
  (for the steps), and the traffic timeline (for the time spent training, without the
  start-up);
- the ``shipyard:network`` tag: the network the job was measured on (a shaped job's
  communication time is subtracted from its step time to get its compute time);
- a step-time metric from ``metric_definitions`` when the job declared one;
- the step times shipyard measured itself (``Shipyard.StepTiming``, ``planner/steps.py``:
  Keras ``fit``, the shipyard.ps client), warm-up excluded: used ahead of the job's wall
  time, after a declared metric or ``--step-time``.

A Failed or Stopped job is planned from the steps it ran when at least
``steps.MIN_STEPS`` of them were timed after warm-up (said in the sources); otherwise the
refusal says why in one line.

What was not measured is given by the caller (``Inputs``), and every value says where it
came from. A job that cannot be planned raises :class:`PlanInputError` naming what is
missing and how to get it (the CLI exits 2 with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shipyard.errors import ValidationError
from shipyard.planner import coordinator, model
from shipyard.planner import steps as step_files
from shipyard.sandbox import shaping

STEP_TIME_METRICS = ("step_time", "sec_per_step", "time_per_step", "step_seconds")
STEP_RATE_METRICS = ("steps_per_sec", "global_step/sec", "steps_per_second")
KIND_TO_MODEL = {
    "mpi": "horovod",
    "torch_distributed": "torch_distributed",
    "pytorchddp": "torch_distributed",
    "multi_worker_mirrored_strategy": "multi_worker_mirrored",
    "smdistributed.dataparallel": model.SMDDP,
}


class PlanInputError(ValidationError):
    """The job cannot be planned from what it measured: the message says what to add."""


@dataclass(frozen=True)
class Inputs:
    """What the user tells ``shipyard plan`` beyond what the job measured."""

    compute_s: float | None = None  # per step at the target type (a GPU type measured here)
    step_s: float | None = None  # the measured job's time per step, if it logged none
    steps: int | None = None  # steps per worker the measured job ran
    gradient_bytes: float | None = None  # for allreduce jobs (no placement report)
    distribution: str | None = None  # plan as this distribution instead of the job's
    allreduce: str | None = None  # ring (NCCL, gloo) or reduce_bcast (Open MPI's default)
    host_cores: float | None = None  # predict runs on this machine: its cores are shared
    # predict runs on this machine (planner.ceiling): its cores shared, its links capped at
    # what two instances here move; the measured run's communication is read the same way
    machine: model.Machine | None = None


@dataclass(frozen=True)
class Measured:
    """The profile plus what it was measured on, and where each number came from."""

    profile: model.Profile
    instances: int
    instance_type: str
    step_s: float
    sources: dict[str, str] = field(default_factory=dict)


def distribution_of(desc: Mapping[str, Any]) -> tuple[str, int]:
    """The model's distribution name for a job, and its processes per host."""
    dist = (desc.get("Shipyard") or {}).get("Distribution") or {}
    kind, options = dist.get("kind"), dist.get("options") or {}
    per_host = int(options.get("processes_per_host") or 1)
    if kind is None:
        return model.PLAIN, 1
    if kind == "parameter_server":
        framework = (desc.get("AlgorithmSpecification") or {}).get("TrainingImage")
        implementation = options.get("implementation") or (
            "tensorflow" if framework == "tensorflow" else "shipyard"
        )
        name = "tf_parameter_server" if implementation == "tensorflow" else "shipyard_ps"
        workers = int(options.get("workers_per_host") or 1)
        return name, workers
    return KIND_TO_MODEL.get(kind, kind), per_host


def _metric_step_time(desc: Mapping[str, Any]) -> float | None:
    """A step-time (or step-rate) metric the job declared and logged: the mean over the
    hosts of each host's last value (workers of an async job each log their own)."""
    last: dict[str, float] = {}
    for m in (desc.get("Shipyard") or {}).get("MetricHistory") or []:
        name = str(m.get("MetricName", "")).lower()
        value = float(m.get("Value") or 0)
        if value > 0 and name in STEP_TIME_METRICS:
            last[str(m.get("Host"))] = value
        elif value > 0 and name in STEP_RATE_METRICS:
            last[str(m.get("Host"))] = 1.0 / value
    return sum(last.values()) / len(last) if last else None


def _training_span(report: Mapping[str, Any]) -> float | None:
    """Seconds from the first to the last change of the traffic timeline: the time the
    workers spent training, without the framework's start-up and the uploads after."""
    points = (report.get("traffic_timeline") or {}).get("points") or []
    totals = [
        (float(p["t"]), sum(map(sum, p.get("bytes_to_shard") or [])))
        for p in points
        if "bytes_to_shard" in p
    ]
    moving = [t for (t, b), (_, before) in zip(totals[1:], totals[:-1]) if b != before]
    if len(moving) < 2:
        return None
    first = next(t for t, b in totals if b > 0)
    return max(moving) - first or None


def _report_steps(report: Mapping[str, Any], workers: int) -> int | None:
    """Steps per worker from the servers' push counts: a shard counts one push per key
    it holds per worker per step."""
    found = [
        int(s.get("pushes") or 0) // (int(s["keys"]) * workers)
        for s in report.get("shards") or []
        if s.get("keys") and s.get("pushes")
    ]
    return max(1, min(found)) if found and workers > 0 else None


def measured_link(desc: Mapping[str, Any]) -> tuple[model.Link | None, str]:
    """The network the job ran on: its ``shipyard:network`` tag, else unlimited (None)."""
    tags = {t.get("Key"): t.get("Value") for t in desc.get("Tags") or []}
    value = tags.get(shaping.TAG)
    if not value:
        return None, "unshaped (this machine's memory-speed network)"
    instance_type = (desc.get("ResourceConfig") or {}).get("InstanceType", "")
    shape = shaping.parse(value, instance_type)
    return (
        model.Link(shape.describe(), shape.rate_bytes_per_s, shape.delay_s * 2, model.TCP_FRAMING),
        f"shaped by tag {shaping.TAG}={value} ({shape.describe()})",
    )


def from_describe(desc: Mapping[str, Any], given: Inputs | None = None) -> Measured:
    """The profile of a finished job (``ControlPlane.describe``'s dict)."""
    given = given or Inputs()
    name = desc.get("TrainingJobName", "?")
    section = desc.get("Shipyard") or {}
    timing = _step_timing(desc, given)
    instances = int((desc.get("ResourceConfig") or {}).get("InstanceCount") or 1)
    instance_type = str((desc.get("ResourceConfig") or {}).get("InstanceType") or "local")
    kind, per_host = distribution_of(desc)
    if given.distribution:
        if given.distribution not in model.DISTRIBUTIONS:
            raise PlanInputError(
                f"--distribution {given.distribution!r} is not known: use one of "
                + ", ".join(model.DISTRIBUTIONS)
            )
        kind = given.distribution
    report = section.get("DistributionReport") or {}
    sources: dict[str, str] = {}
    variables: tuple[float, ...] = tuple(
        float(e.get("bytes") or 0) for e in report.get("placement") or []
    )
    if given.gradient_bytes:
        variables = (float(given.gradient_bytes),)
        sources["gradient_bytes"] = "given (--gradient-bytes)"
    elif variables and sum(variables) > 0:
        sources["gradient_bytes"] = "the job's placement report"
    else:
        raise PlanInputError(
            f"job {name!r} measured no variable sizes (only parameter-server jobs write a "
            "placement report): give the gradient bytes per step with --gradient-bytes "
            "(parameters x 4 for float32), or run the job once with distribution "
            "parameter_server"
        )
    # TensorFlow's ParameterServerStrategy (the tf2 layout's one coordinator): placement
    # with the slots on their variable's ps, and steps handed to free workers
    coordinated = (
        kind == "tf_parameter_server"
        and report.get("implementation") == "tensorflow"
        and report.get("layout") == "tf2"
        and not given.gradient_bytes
    )
    ps_loads: tuple[float, ...] = ()
    if coordinated:
        turns, ps_loads = coordinator.read_placement(
            report.get("placement") or [], int(report.get("num_shards") or 0)
        )
        coordinated = sum(turns) > 0
    if coordinated:
        variables = turns
        sources["gradient_bytes"] = (
            "the job's placement report: its trainable variables (optimizer slots stay on "
            "their variable's ps)"
        )
    workers = instances * per_host
    steps = given.steps or _report_steps(report, workers)
    metric = _metric_step_time(desc)
    step_s = given.step_s or metric
    if given.step_s:
        sources["step_time"] = "given (--step-time)" + _unused(timing)
    elif step_s:
        sources["step_time"] = "the job's step-time metric" + _unused(timing)
    elif timing:
        step_s = float(timing["MedianStepSeconds"])
        sources["step_time"] = step_files.describe_line(timing)
        # steps per worker: a coordinator (one timed process) ran every worker's steps
        timed = max(1, int(timing["Workers"]), workers)
        steps = steps or max(1, int(timing["StepsRun"]) // timed)
    elif steps:
        span = _training_span(report)
        where = "the traffic timeline's training span"
        if span is None:
            span = float(desc.get("TrainingTimeInSeconds") or 0)
            where = "TrainingTimeInSeconds (start-up included: an upper bound)"
        if span > 0:
            step_s = span / steps
            origin = "--steps" if given.steps else "the servers' push counts"
            sources["step_time"] = f"{where} / {steps} steps ({origin})"
    if not step_s or step_s <= 0:
        raise PlanInputError(
            f"job {name!r} measured no step time (shipyard times the steps of Keras fit, "
            "shipyard.ps and Horovod with PyTorch itself): log one and declare it in metric_definitions (Name 'step_time', "
            "seconds per step), or give --step-time SECONDS or --steps N (steps per worker "
            "the job ran)"
        )
    if desc.get("TrainingJobStatus") != "Completed":
        sources["job_status"] = (
            f"{desc.get('TrainingJobStatus')}: planned from the steps it ran"
            + (f" ({timing['Steps']} timed after warm-up)" if timing else "")
        )
    link, link_source = measured_link(desc)
    host_cores = given.host_cores
    per_byte = 0.0
    if given.machine is not None:
        link, link_source = _on_machine(link, link_source, given.machine)
        host_cores = host_cores or given.machine.cores
        sources["same_machine"] = _machine_line(given.machine)
        if kind == "shipyard_ps":  # unknown: 0 here, and same_machine says why
            per_byte = given.machine.ps_cpu_s_per_byte or 0.0
    sources["measured_network"] = link_source
    push, pull = _overheads(report, variables, workers, steps)
    epoch = None
    if coordinated:
        # the relays count the pulls but not the gradients (TensorFlow's receiver fetches
        # them over its own connection): no wire overhead is measurable
        push = pull = 1.0
        epoch = coordinator.steps_per_epoch(timing)
        sources["dispatch"] = "TensorFlow's coordinator: each step to the first free worker" + (
            f", Keras joining them every {epoch} steps (its first epoch's)"
            if epoch
            else " (steps per epoch unknown: the workers' rates summed)"
        )
    base = model.Profile(
        distribution=kind,
        compute_s=step_s,
        variables=variables,
        processes_per_host=per_host,
        placement=_placement(report),
        consistency=str((report.get("consistency") or {}).get("mode") or "async"),
        push_overhead=push,
        pull_overhead=pull,
        chunk_bytes=float(report.get("chunk_bytes") or model.DEFAULT_CHUNK_BYTES),
        allreduce=given.allreduce or "ring",
        host_cores=host_cores,
        host_cpu_s_per_byte=per_byte,
        dispatch=coordinator.COORDINATOR if coordinated else "worker",
        ps_loads=ps_loads,
        steps_per_epoch=epoch,
    )
    if given.host_cores:
        sources["shared_host"] = (
            f"given (--shared-host): every instance on one machine of {given.host_cores:g} cores"
        )
    measured_split = _measured_compute(timing, step_s) if given.machine is not None else None
    if given.compute_s:
        compute, sources["compute_time"] = given.compute_s, "given (--compute-time)"
    elif measured_split is not None:
        compute, sources["compute_time"] = measured_split
        sources["compute_time"] += f" on {instance_type}, on the cores it shared here"
    elif coordinated and link is not None:
        compute = coordinator.compute_of(base, link, instances, step_s)
        sources["compute_time"] = (
            f"measured here: step time {step_s:.4g}s, of which the coordinator's workers "
            f"(each its own remote bytes, the epoch's last steps waited for) leave "
            f"{compute:.4g}s of compute on {instance_type}"
        )
    else:
        comm = model.predict(base, link, instances).comm_s if link else 0.0
        extra = model.transport_cpu_s(base, workers)
        compute = model.compute_of(
            step_s, comm, workers, host_cores, model.collective(base.distribution), extra
        )
        sources["compute_time"] = (
            f"measured here: step time {step_s:.4g}s"
            + (f" less {comm:.4g}s of predicted communication" if comm else "")
            + (
                f", at most {host_cores:g} cores' share of {workers} workers"
                if host_cores and (workers > host_cores or extra > 0)
                else ""
            )
            + (f" after {extra:.4g}s of shipyard.ps CPU a step" if extra > 0 else "")
            + f" on {instance_type}"
        )
    profile = replace(base, compute_s=compute, compute_source=sources["compute_time"])
    if measured_split is not None and not given.compute_s:
        window, in_compute, line = _measured_overlap(timing)
        profile = replace(profile, overlap_window=window, transport_in_compute=in_compute)
        if line:
            link_s = model.predict(profile, link, instances).comm_s if link else 0.0
            tail = _unexplained_wait(timing, link_s, step_s)
            profile = replace(profile, transport_wait_s=tail)
            sources["overlap"] = line + (
                f"; {tail:.4g}s of its wait is not its link's (the transport's own)" if tail else ""
            )
    return Measured(profile, instances, instance_type, step_s, sources)


def _on_machine(
    link: model.Link | None, source: str, machine: model.Machine
) -> tuple[model.Link | None, str]:
    """The measured run's link as this machine gave it: an unshaped run moved at the
    machine's ceiling, a shaped one at most at it (unchanged where it is unknown)."""
    if machine.bytes_per_s is None:
        return link, source
    gbit = machine.bytes_per_s * 8 / 1e9
    if link is None:
        here = model.Link("this machine", machine.bytes_per_s, framing=model.TCP_FRAMING)
        return here, f"unshaped: this machine's {gbit:.1f} Gbit/s between instances (measured)"
    if link.bytes_per_s <= machine.bytes_per_s:
        return link, source
    return (
        model.on_machine(link, machine),
        f"{source}, capped at this machine's {gbit:.1f} Gbit/s between instances (measured)",
    )


#: step-timing sources whose communication is the wall time a worker spent inside its
#: push/pull calls, so the rest of its step is its own compute
SPLIT_SOURCES = ("shipyard.ps client",)


def _measured_compute(timing: Mapping[str, Any], step_s: float) -> tuple[float, str] | None:
    """A same-machine reading's compute from the split shipyard measured (the ps client's
    compute and push/pull medians), scaled to the step time in use; None without one.

    Why: predicted from the link alone, the communication of the demo's CNN at 1.25
    Gbit/s is 37 ms a step, but the workers measured 26.7 ms in push/pull (the pushes
    start during backward, so part of the wire time hides behind it) and 32.6 ms of
    compute; a compute derived as step - 37 ms (24 ms) predicted the 10 Gbit/s run 45%
    fast (issue 39). Only for the same machine: on it the measured compute is what the
    shared cores gave the worker beside the transport, the quantity the shared-host
    term wants; plans for real instances keep deriving it (their accuracy was measured
    so)."""
    if timing.get("Source") not in SPLIT_SOURCES:
        return None
    compute, comm = timing.get("ComputeSeconds"), timing.get("CommSeconds")
    if compute is None or comm is None or float(compute) <= 0:
        return None
    share = float(compute) / (float(compute) + float(comm))
    return (
        step_s * share,
        f"measured by shipyard: {share:.0%} of the step outside push/pull (medians "
        f"{float(compute):.4g}s compute, {float(comm):.4g}s push/pull) x step time {step_s:.4g}s",
    )


def _measured_overlap(timing: Mapping[str, Any]) -> tuple[float, float, str]:
    """From the ps client's split (``_measured_compute`` took it): the share of the
    compute its pushed gradients travelled behind (the overlap window over the compute)
    and the share of the step's time in flight that ran behind compute (the overlap
    window over the window and the wait: the share of the transport's work that ran
    while the worker computed). (0, 0, "") where the client measured no overlap (a job
    from before it did, or one that pushes only at its step's end).

    Why: at 1.25 Gbit/s the demo's CNN waited 20 ms a step where its link needs 37 ms,
    the rest travelled behind backward, and the model charged all 37 ms after compute
    (its prediction of that run was 14% slow); the transport's CPU that ran behind
    compute is inside the compute measured, so the shared cores' bound must not add it
    again (issue 39)."""
    overlap, compute, comm = (
        timing.get(k) for k in ("OverlapSeconds", "ComputeSeconds", "CommSeconds")
    )
    if overlap is None or compute is None or comm is None:
        return 0.0, 0.0, ""
    overlap, compute, comm = float(overlap), float(compute), float(comm)
    if overlap <= 0 or compute <= 0:
        return 0.0, 0.0, ""
    window = min(1.0, overlap / compute)
    in_compute = overlap / (overlap + comm)
    return (
        window,
        in_compute,
        f"measured by shipyard: pushed gradients travel behind {window:.0%} of the compute "
        f"(median window {overlap:.4g}s), {in_compute:.0%} of the time in flight",
    )


def _unexplained_wait(timing: Mapping[str, Any], link_s: float, step_s: float) -> float:
    """The seconds of the measured wait (push/pull outside the overlap window) that the
    link does not explain: the wait less what the link needed beyond the window (none
    where the window held all of it), scaled to the step time in use as the compute is
    (``_measured_compute``). Why: that part is the transport's processing of a step's
    last pieces (the shards' updates and replies, the client's receive) and stays when
    the link changes; at 10 Gbit/s the demo's CNN waited 9.3 ms for a link that needed
    4.8 ms, all of which had travelled behind backward (issue 39)."""
    overlap, compute, comm = (
        float(timing[k]) for k in ("OverlapSeconds", "ComputeSeconds", "CommSeconds")
    )
    scale = step_s / (compute + comm)
    return max(0.0, comm * scale - max(0.0, link_s - overlap * scale))


def _machine_line(machine: model.Machine) -> str:
    rate = (
        f"{machine.bytes_per_s * 8 / 1e9:.1f} Gbit/s between instances"
        if machine.bytes_per_s is not None
        else f"ceiling unknown ({machine.why})"
    )
    line = f"this machine: {rate}, {machine.cores:g} cores shared"
    if machine.ps_cpu_s_per_byte is not None:
        line += f", shipyard.ps {machine.ps_cpu_s_per_byte * 1e9:.2f} CPU-s per GB"
    return line


def _step_timing(desc: Mapping[str, Any], given: Inputs) -> dict[str, Any]:
    """The job's measured steps (``Shipyard.StepTiming``, {} if none), once it has ended.

    A Failed or Stopped job is planned from the steps it ran when enough were timed (or
    a step time is given or logged); otherwise one line says why not."""
    name = desc.get("TrainingJobName", "?")
    status = desc.get("TrainingJobStatus")
    timing = dict((desc.get("Shipyard") or {}).get("StepTiming") or {})
    if status not in ("Completed", "Failed", "Stopped"):
        raise PlanInputError(
            f"job {name!r} is {status}: plan needs a job that has ended (its step times "
            f"and traffic are only final then); wait with `shipyard logs -f {name}` or "
            "plan another job"
        )
    if status == "Completed" or given.step_s or _metric_step_time(desc):
        return timing
    timed = int(timing.get("Steps") or 0)
    if timed >= step_files.MIN_STEPS:
        return timing
    if timing:
        why = (
            f"only {timed} step(s) were timed after warm-up (of {timing.get('StepsRun')} it "
            f"ran; plan needs {step_files.MIN_STEPS})"
        )
    else:
        why = "shipyard timed none of its steps (it ended before training, or its steps were none shipyard times: Keras fit, shipyard.ps, Horovod with PyTorch)"
    raise PlanInputError(
        f"job {name!r} is {status} and cannot be planned: {why}; give --step-time SECONDS "
        "or plan a job that ran longer"
    )


def _unused(timing: Mapping[str, Any]) -> str:
    """What the step time given or logged won over, said."""
    if not timing:
        return ""
    return f" (wins over shipyard's measured {float(timing['MedianStepSeconds']):.4g}s)"


def _placement(report: Mapping[str, Any]) -> str:
    """The policy to re-place the variables with at other counts: shipyard.ps' ``auto``
    re-decides per count; TensorFlow's is round-robin by creation order."""
    if report.get("requested_policy") == "auto":
        return "auto"
    policy = report.get("policy")
    return str(policy) if policy in model.PLACEMENTS else "round_robin"


def _overheads(
    report: Mapping[str, Any], variables: tuple[float, ...], workers: int, steps: int | None
) -> tuple[float, float]:
    """Measured wire bytes per tensor byte, pushed and pulled (1.0 when not measurable).

    Only shards on other instances cross a NIC, but every relay counts; so the ratio is
    taken over all traffic: (bytes to the servers / steps / workers) / model bytes."""
    traffic = report.get("traffic") or {}
    total = sum(variables)
    if not steps or not total or not workers:
        return 1.0, 1.0
    to = sum(map(sum, traffic.get("bytes_to_shard") or []))
    frm = sum(map(sum, traffic.get("bytes_from_shard") or []))
    peers = len(traffic.get("bytes_to_shard") or []) or workers

    def ratio(moved: float) -> float:
        value = moved / steps / peers / total
        return value if 0.5 <= value <= 4.0 else 1.0

    return ratio(to), ratio(frm)
