"""``shipyard doctor``: what this machine supports, what is missing, and the fix for each.

Checks are cheap and import no framework (a package's presence and version are read from
its metadata): instance sandboxes (namespaces, iproute2, pasta for outbound traffic),
instance types' limits (cgroups),
death signals (setpriv), the bind shim of Ray nodes (built here with ``cc`` on first use),
FUSE (FastFile mode), MPI, TensorFlow, PyTorch, GPUs.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass

import typer
from rich.console import Console
from rich.table import Table


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _package(name: str, dist: str, fix: str, what: str) -> Check:
    if importlib.util.find_spec(name) is None:
        return Check(what, False, f"{dist} is not installed", fix)
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "installed"
    return Check(what, True, f"{dist} {version}")


def checks() -> list[Check]:
    from shipyard.agent.channels.fuse import usable
    from shipyard.mpi.command import MPIRunNotFoundError, find_mpirun
    from shipyard.sandbox import probe, tools

    found: list[Check] = []
    support = probe.support()
    if support.ok:
        mode = "rootless (a user namespace per job)" if support.rootless else "as root"
        found.append(Check("instance sandbox", True, f"mount, UTS and network namespaces, {mode}"))
    else:
        found.append(
            Check(
                "instance sandbox",
                False,
                f"{support.reason}: jobs run without /opt/ml and their listeners are "
                "visible on this machine",
                support.fix,
            )
        )
    found.append(_cgroups())
    pasta = tools.find("pasta")
    found.append(
        Check(
            "outbound traffic from sandboxes",
            pasta is not None,
            f"pasta at {pasta}"
            if pasta
            else "pasta (passt) is not installed: sandboxed "
            "instances have no outbound network (pip install, S3 on the host)",
            "" if pasta else "apt-get install passt",
        )
    )
    setpriv = shutil.which("setpriv")
    found.append(
        Check(
            "death signals",
            setpriv is not None,
            f"setpriv at {setpriv}"
            if setpriv
            else "util-linux setpriv is missing: a "
            "killed agent's processes are cleaned up by the process tree walk only",
            "" if setpriv else "apt-get install util-linux",
        )
    )
    from shipyard.sandbox import bindshim

    shim = bindshim.build()  # compiled once per source version, then cached
    found.append(
        Check(
            "bind shim (Ray nodes)",
            shim.path is not None,
            f"wildcard listeners bind the node's cluster address ({shim.path})"
            if shim.path
            else f"{shim.reason}: on Ray, Open MPI's and tf.distribute.Server's listeners "
            "bind every address of the node",
            shim.fix,
        )
    )
    fuse = usable()
    found.append(
        Check(
            "FUSE (FastFile mode)",
            fuse is None,
            "usable" if fuse is None else f"{fuse}: FastFile channels fall back to File",
            "" if fuse is None else "modprobe fuse, or run with /dev/fuse and CAP_SYS_ADMIN",
        )
    )
    try:
        mpirun = find_mpirun()
        mpi = _package("mpi4py", "mpi4py", "pip install 'shipyard[mpi]'", "MPI")
        found.append(Check("MPI", mpi.ok, f"mpirun at {mpirun}; {mpi.detail}", mpi.fix))
    except MPIRunNotFoundError as exc:
        found.append(Check("MPI", False, str(exc), "pip install 'shipyard[mpi]'"))
    found.append(
        _package("tensorflow", "tensorflow-cpu", "pip install 'shipyard[tensorflow]'", "TensorFlow")
        if importlib.util.find_spec("tensorflow") is None or _has_dist("tensorflow-cpu")
        else _package(
            "tensorflow", "tensorflow", "pip install 'shipyard[tensorflow]'", "TensorFlow"
        )
    )
    found.append(_package("torch", "torch", "pip install 'shipyard[torch]'", "PyTorch"))
    gpus = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    found.append(
        Check(
            "GPUs",
            bool(gpus),
            f"{len(gpus)} NVIDIA device(s)" if gpus else "no NVIDIA GPU: CPU instance types only",
            "" if gpus else "install the NVIDIA driver (only needed for GPU instance types)",
        )
    )
    return found


def _cgroups() -> Check:
    """Instance types' CPUs, memory and process limits (sandbox.cgroups)."""
    from shipyard.sandbox import cgroups

    found = cgroups.detect()
    if found.usable:
        return Check(
            "instance resources (cgroups)",
            True,
            f"cgroup v{found.version}: each instance gets its type's CPUs, memory and a "
            "process limit",
        )
    return Check(
        "instance resources (cgroups)",
        False,
        f"{found.reason}: instances run without CPU, memory and process limits",
        found.fix,
    )


def _has_dist(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def doctor() -> None:
    """Report what this machine supports (sandboxes, FUSE, MPI, TF, torch, GPUs) and how
    to fix what is missing."""
    table = Table("check", "", "detail", "fix")
    for check in checks():
        table.add_row(
            check.name,
            "[green]ok[/]" if check.ok else "[yellow]missing[/]",
            check.detail,
            check.fix,
        )
    Console(highlight=False).print(table)


def register(app: typer.Typer) -> None:
    app.command()(doctor)
