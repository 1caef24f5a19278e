"""``shipyard doctor``: what this machine supports, what is missing, and the fix for each.

Checks are cheap and import no framework (a package's presence and version are read from
its metadata): instance sandboxes (namespaces, iproute2, pasta for outbound traffic),
instance types' limits (cgroups),
death signals (setpriv), the bind shim of Ray nodes (built here with ``cc`` on first use),
FUSE (FastFile mode), MPI, TensorFlow, PyTorch, GPUs. Below the table, this machine's
ceiling for emulated runs (``same-machine ceiling: X Gbit/s between instances, N cores
shared``, :mod:`shipyard.planner.ceiling`): measured once (about half a second) and
cached in the home; ``--measure`` measures it again.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import time
from dataclasses import dataclass

import typer
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from shipyard import settings


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
    if support.ok:
        gaps = probe.isolation_gaps()
        found.append(
            Check(
                "instance isolation",
                not gaps,
                "; ".join(what for what, _ in gaps)
                or "own PID and IPC namespaces and /proc, no capabilities, a seccomp filter, "
                "host hidden, throw-away /etc",
                " && ".join(dict.fromkeys(fix for _, fix in gaps)),
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
    from shipyard.sandbox import shaping

    shape = shaping.support()
    found.append(
        Check(
            "network emulation (shipyard:network)",
            shape.tbf and shape.netem,
            "tbf (bandwidth) and netem (latency)"
            if shape.netem
            else f"{shape.detail}: "
            + ("bandwidth only, latencies are not emulated" if shape.tbf else "jobs run unshaped"),
            "" if shape.netem else "modprobe sch_netem (kernel config NET_SCH_NETEM)",
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


def table(found: list[Check]) -> Table:
    """The checks as a table. Names, details and fixes go in as plain ``Text``, never as
    rich markup: ``pip install 'shipyard[tensorflow]'`` read as markup loses its
    ``[tensorflow]`` (a style tag to rich), and the advice then installs nothing."""
    # long words (a path, a pip line) fold inside their cell instead of ending in "…"
    out = Table("check", "", Column("detail", overflow="fold"), Column("fix", overflow="fold"))
    for check in found:
        out.add_row(
            Text(check.name),
            "[green]ok[/]" if check.ok else "[yellow]missing[/]",
            Text(check.detail),
            Text(check.fix),
        )
    return out


def doctor(
    show_settings: bool = typer.Option(
        False,
        "--settings",
        help="print every SHIPYARD_* setting, its value and where it came from (env or default)",
    ),
    measure: bool = typer.Option(
        False,
        "--measure",
        help="measure this machine's same-machine ceiling again (what two instances move "
        "between them, the cores they share) instead of reading the cached one",
    ),
) -> None:
    """What this machine supports (sandboxes, FUSE, MPI, TF, torch, GPUs), each gap's fix."""
    if show_settings:
        print_settings()
        return
    # a terminal: the table wraps to its width; a pipe: one line per check, nothing cut
    from shipyard.cli.output import out_console

    console = out_console()
    console.print(table(checks()))
    for line in ceiling_lines(measure):
        console.print(line)


def ceiling_lines(refresh: bool = False) -> list[Text]:
    """The same-machine ceiling (cached in the home; measured when missing or asked) as
    two lines: the figure, then how and where it was measured."""
    from shipyard.control.home import default_home
    from shipyard.planner import ceiling

    home = default_home()
    cached = None if refresh else ceiling.load(home)
    found = cached or ceiling.get(home, refresh=True)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(found.measured_at))
    how = f"cached (measured {when})" if cached else f"measured now in {found.seconds:.1f} s"
    where = f" over {found.path}" if found.path else ""
    return [
        Text(found.line()),
        Text(
            f"  {how}{where}, load average {found.load_average:.2f} then (other work "
            f"lowers it: measure on a quiet machine); cores: {found.cores_source}; in "
            f"{ceiling.cache_path(home)} "
            "(`shipyard doctor --measure` measures again)",
            style="dim",
        ),
    ]


def print_settings() -> None:
    """Every setting as this process sees it; a value its setting refuses is shown with the
    reason and makes the command exit 1 (what would fail later, said now)."""
    table = Table("setting", "value", "from", "accepts", "meaning")
    bad = 0
    for setting, raw, source, problem in settings.report():
        value = "" if raw is None else raw
        if source == "env" and "SECRET" in setting.name:
            value = "(set)"  # a key or job secret: never print it
        shown = Text(value)
        if problem != "ok":
            bad += 1
            shown = Text(value, style="red") + Text(f" ({problem})")
        table.add_row(
            Text(setting.name),
            shown,
            source,
            Text(setting.accepts()),
            Text(setting.meaning)
            + Text(" (set by shipyard)" if setting.audience == "internal" else "", style="dim"),
        )
    Console(highlight=False, width=200).print(table)
    if bad:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(doctor)
