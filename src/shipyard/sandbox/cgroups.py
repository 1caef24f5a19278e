"""An instance's CPUs, memory and process count, enforced by the kernel's cgroup files.

The backend that launches instances creates one cgroup per instance (below its own
cgroup, as delegation requires: ``<own>/shipyard.<launcher pid>.<launch>.<job>/<host>``), moves
each agent into it right after spawning it: the agent is still starting its interpreter
then, so every process the instance ever makes is born inside. No preexec_fn, no helper
exec on the launch path (launch overhead matters), nothing that has to run inside the
instance's namespaces: the other half of the sandbox (``sandbox.instance``) stays
independent of this one.

Both cgroup versions: v2 (one ``cgroup2`` mount whose ``cgroup.controllers`` offers
``memory``) is preferred; else v1, one mount per controller (this repository's CI machine:
v1 with an empty v2 at ``/sys/fs/cgroup/unified``). Where no cgroup can be created (rootless
without a delegated cgroup, a read-only ``/sys/fs/cgroup``) instances run unlimited and
:func:`detect` says why and what fixes it.

A job's cgroups end with it: :meth:`JobCgroups.release` kills what is left in them and
removes the directories; a small shell reaper, started with them and holding a pipe from
the launcher, does the same if the launcher dies without releasing (SIGKILL included);
a later launch also removes empty leftovers of launchers that are gone.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from functools import lru_cache

from shipyard import settings
from shipyard.runtime.lifeline import pid_alive
from shipyard.sandbox import shellreaper

OFF_VALUES = ("off", "0", "false", "no")
# v1 controllers an instance uses: cpuset (its CPUs), memory (hard limit, OOM count),
# pids (fork bombs), cpuacct (CPU time for utilization), devices (the GPUs of other
# instances denied; only joined by a job that denies one)
V1_CONTROLLERS = ("cpuset", "memory", "pids", "cpuacct", "devices")
DEVICES = "devices"
V2_CONTROLLERS = ("cpuset", "cpu", "memory", "pids")
PREFIX = "shipyard."
RELEASE_WAIT_S = 5.0
_LAUNCHES = itertools.count(1)


@dataclass(frozen=True)
class Limits:
    """What one instance may use; None/empty: no limit of that kind."""

    cpus: tuple[int, ...] = ()  # the CPU ids of its cpuset
    memory_bytes: int | None = None
    pids_max: int | None = None
    # device rules to deny (``c 195:3 rwm``: another instance's GPU); cgroup v1 only:
    # v2 has no devices files, it takes a BPF program (see devices_note)
    denied_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hierarchy:
    """Where this process may create cgroups: ``bases`` maps each controller (v2: the
    single key ``"unified"``) to the directory new cgroups go below."""

    version: int  # 2, 1, or 0: none usable
    bases: dict[str, str] = field(default_factory=dict)
    reason: str = ""  # version 0: why not
    fix: str = ""  # version 0: the command or setting that would make it work

    @property
    def usable(self) -> bool:
        return self.version in (1, 2)


def switched_off() -> bool:
    return settings.text("SHIPYARD_CGROUPS") in OFF_VALUES


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fstype, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
                continue
            out.append((fields[3], fields[4], rfields[0], set(rfields[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and ``""`` -> its v2 path."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                out[name] = path
    return out


def _join(mount_root: str, mount_point: str, path: str) -> str:
    """The directory of cgroup ``path`` (as /proc/self/cgroup names it) on this mount."""
    if mount_root != "/" and path.startswith(mount_root):
        path = path[len(mount_root) :]
    return os.path.join(mount_point, path.lstrip("/"))


def _read(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read().strip()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(value)


@lru_cache(maxsize=1)
def _detect() -> Hierarchy:
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return Hierarchy(0, reason=f"cannot read this process's cgroups: {exc}")
    for root, point, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        base = _join(root, point, own[""])
        try:
            offered = set(_read(os.path.join(base, "cgroup.controllers")).split())
        except OSError:
            continue
        if "memory" in offered:
            found = _v2(base, offered)
            if not found.usable and base.rstrip("/") != point.rstrip("/"):
                # its own cgroup holds processes (a login session, a service): as root,
                # the hierarchy's root may still take children with every controller
                try:
                    top = set(_read(os.path.join(point, "cgroup.controllers")).split())
                except OSError:
                    top = set()
                alt = _v2(point, top) if "memory" in top else found
                if alt.usable:
                    return alt
            return found
    bases: dict[str, str] = {}
    for root, point, fstype, options in mounts:
        if fstype != "cgroup":
            continue
        for name in V1_CONTROLLERS:
            if name in options and name in own and name not in bases:
                bases[name] = _join(root, point, own[name])
    if "memory" not in bases:
        return Hierarchy(0, reason="no cgroup memory controller is mounted on this machine")
    if not all(os.access(b, os.W_OK) for b in bases.values()):
        return Hierarchy(
            0,
            reason="cgroup v1 and this user may not create cgroups (v1 has no delegation)",
            fix="run as root, or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) "
            "and run under `systemd-run --user --scope -p Delegate=yes`",
        )
    return Hierarchy(1, bases)


def _v2(base: str, offered: set[str]) -> Hierarchy:
    """v2: new cgroups go below this process's own cgroup, which must let its children
    use the controllers (it can only if it holds no process itself, or is the root)."""
    fix = (
        "run under a delegated cgroup: `systemd-run --user --scope -p Delegate=yes "
        "shipyard ...` (or as root)"
    )
    if not os.access(base, os.W_OK):
        return Hierarchy(0, reason=f"this user may not create cgroups under {base}", fix=fix)
    wanted = [c for c in V2_CONTROLLERS if c in offered]
    try:
        enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
        missing = [c for c in wanted if c not in enabled]
        if missing:
            _write(os.path.join(base, "cgroup.subtree_control"), " ".join(f"+{c}" for c in missing))
    except OSError as exc:
        why = "it holds processes itself" if exc.errno == errno.EBUSY else str(exc)
        return Hierarchy(
            0, reason=f"cannot enable cgroup controllers below {base} ({why})", fix=fix
        )
    return Hierarchy(2, {"unified": base})


def detect() -> Hierarchy:
    """Where instances' cgroups can go here (cached); SHIPYARD_CGROUPS=off: nowhere."""
    if switched_off():
        return Hierarchy(0, reason="SHIPYARD_CGROUPS=off", fix="unset SHIPYARD_CGROUPS")
    return _detect()


def cpu_sets(per_instance: int, instances: int, available: list[int]) -> list[tuple[int, ...]]:
    """Each instance's CPUs: consecutive blocks of ``per_instance`` of the ``available``
    CPUs, so a job's instances share no CPU while the machine has enough; beyond that the
    blocks wrap around (instances share CPUs, as processes on one machine do)."""
    if not available or per_instance <= 0:
        return [() for _ in range(instances)]
    k = min(per_instance, len(available))
    return [
        tuple(sorted({available[(i * k + j) % len(available)] for j in range(k)}))
        for i in range(instances)
    ]


def cpu_list(cpus: tuple[int, ...]) -> str:
    """The kernel's list format (``0-3,6``)."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass
class InstanceCgroup:
    """One instance's cgroup: a directory per controller (v2: one)."""

    host: str
    version: int
    dirs: dict[str, str]  # controller (v2: "unified") -> directory
    limits: Limits

    def _dir(self, controller: str) -> str | None:
        return self.dirs.get("unified" if self.version == 2 else controller)

    def join(self, pid: int) -> None:
        """Move process ``pid`` (and what it starts from now on) into this cgroup."""
        for directory in dict.fromkeys(self.dirs.values()):
            _write(os.path.join(directory, "cgroup.procs"), str(pid))

    def pids(self) -> set[int]:
        out: set[int] = set()
        for directory in self.dirs.values():
            try:
                out.update(int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split())
            except (OSError, ValueError):
                continue
        return out

    def oom_kills(self) -> int:
        """Processes the kernel killed here for exceeding the memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return self._counter("memory", name, "oom_kill")

    def pids_refused(self) -> int:
        """Forks the kernel refused here because the process limit was reached."""
        return self._counter("pids", "pids.events", "max")

    def _counter(self, controller: str, name: str, key: str) -> int:
        """One ``key value`` line of a controller's events file; 0 when absent."""
        directory = self._dir(controller)
        try:
            text = _read(os.path.join(directory, name)) if directory else ""
        except OSError:
            return 0
        for line in text.splitlines():
            found, _, value = line.partition(" ")
            if found == key:
                return int(value)
        return 0

    def cpu_seconds(self) -> float | None:
        """CPU time used by every process of the instance so far."""
        try:
            if self.version == 2:
                for line in _read(os.path.join(self.dirs["unified"], "cpu.stat")).splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
                return None
            directory = self._dir("cpuacct")
            return int(_read(os.path.join(directory, "cpuacct.usage"))) / 1e9 if directory else None
        except (OSError, ValueError):
            return None

    def memory_bytes(self) -> int | None:
        """Memory in use, less the page cache the kernel may drop (as ``docker stats``)."""
        directory = self._dir("memory")
        if directory is None:
            return None
        try:
            if self.version == 2:
                used = int(_read(os.path.join(directory, "memory.current")))
                inactive_key = "inactive_file"
            else:
                used = int(_read(os.path.join(directory, "memory.usage_in_bytes")))
                inactive_key = "total_inactive_file"
            for line in _read(os.path.join(directory, "memory.stat")).splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    return max(0, used - int(value))
            return used
        except (OSError, ValueError):
            return None


def _mkdir(path: str) -> None:
    try:
        os.mkdir(path)
    except FileExistsError:
        pass


@dataclass
class JobCgroups:
    """The cgroups of one launch of a job's instances."""

    hierarchy: Hierarchy
    job_dirs: list[str]  # one per controller (v2: one)
    instances: dict[str, InstanceCgroup]
    reaper: subprocess.Popen | None = None

    def all_dirs(self) -> list[str]:
        """Leaves first, so removing them in order works."""
        leaves = [d for cg in self.instances.values() for d in cg.dirs.values()]
        return list(dict.fromkeys(leaves + self.job_dirs))

    def release(self) -> list[str]:
        """Kill whatever is still in the job's cgroups, remove them; returns the
        directories that would not go within RELEASE_WAIT_S (normally none)."""
        deadline = time.monotonic() + RELEASE_WAIT_S
        left = self.all_dirs()
        # a SIGKILLed process leaves its cgroup within a millisecond or so: look again
        # after 0.5 ms, doubling to 10 ms, where a flat 10 ms made every job's end wait
        # at least that long for an instance's init or pasta still exiting (issue 40)
        pause = 0.0005
        while True:
            for cg in self.instances.values():
                for pid in cg.pids():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            left = [d for d in left if not _rmdir(d)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        if self.reaper is not None:  # its work is done: it finds nothing left and exits
            if self.reaper.stdin is not None:
                self.reaper.stdin.close()
            self.reaper = None  # subprocess reaps it (not waited for: off the job's end path)
        return left


def _rmdir(path: str) -> bool:
    """True when ``path`` is gone."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def sweep(hierarchy: Hierarchy) -> None:
    """Remove the (empty) job cgroups of launchers that are gone."""
    for base in hierarchy.bases.values():
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if not name.startswith(PREFIX):
                continue
            pid = name[len(PREFIX) :].split(".", 1)[0]
            if not pid.isdigit() or pid_alive(int(pid)):
                continue
            job_dir = os.path.join(base, name)
            for child in os.listdir(job_dir):
                if os.path.isdir(os.path.join(job_dir, child)):
                    _rmdir(os.path.join(job_dir, child))
            _rmdir(job_dir)


def _job_dir(hierarchy: Hierarchy, controller: str, base: str, job: str, launch: int) -> str:
    """The job's cgroup on one controller, set up so instances below it can be limited."""
    directory = os.path.join(base, f"{PREFIX}{os.getpid()}.{launch}.{job}")
    _mkdir(directory)
    if hierarchy.version == 1 and controller == "cpuset":
        # v1 cpusets start empty: a child can only take CPUs its parent has
        for name in ("cpuset.cpus", "cpuset.mems"):
            _write(os.path.join(directory, name), _read(os.path.join(base, name)))
    if hierarchy.version == 2:
        offered = set(_read(os.path.join(directory, "cgroup.controllers")).split())
        wanted = [c for c in V2_CONTROLLERS if c in offered]
        if wanted:
            _write(
                os.path.join(directory, "cgroup.subtree_control"),
                " ".join(f"+{c}" for c in wanted),
            )
    return directory


def _apply(cg: InstanceCgroup, job_dirs: dict[str, str]) -> None:
    limits = cg.limits
    if cg.version == 2:
        directory = cg.dirs["unified"]
        if limits.cpus:
            if os.path.exists(os.path.join(directory, "cpuset.cpus")):
                _write(os.path.join(directory, "cpuset.cpus"), cpu_list(limits.cpus))
            elif os.path.exists(os.path.join(directory, "cpu.max")):
                period = 100_000
                _write(os.path.join(directory, "cpu.max"), f"{len(limits.cpus) * period} {period}")
        if limits.memory_bytes is not None:
            _write(os.path.join(directory, "memory.max"), str(limits.memory_bytes))
            if os.path.exists(os.path.join(directory, "memory.swap.max")):
                _write(os.path.join(directory, "memory.swap.max"), "0")
        if limits.pids_max is not None and os.path.exists(os.path.join(directory, "pids.max")):
            _write(os.path.join(directory, "pids.max"), str(limits.pids_max))
        return
    if "cpuset" in cg.dirs:
        cpus = (
            cpu_list(limits.cpus)
            if limits.cpus
            else _read(os.path.join(job_dirs["cpuset"], "cpuset.cpus"))
        )
        _write(os.path.join(cg.dirs["cpuset"], "cpuset.cpus"), cpus)
        _write(
            os.path.join(cg.dirs["cpuset"], "cpuset.mems"),
            _read(os.path.join(job_dirs["cpuset"], "cpuset.mems")),
        )
    if limits.memory_bytes is not None and "memory" in cg.dirs:
        _write(os.path.join(cg.dirs["memory"], "memory.limit_in_bytes"), str(limits.memory_bytes))
        memsw = os.path.join(cg.dirs["memory"], "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):  # no swapping past the limit either
            _write(memsw, str(limits.memory_bytes))
    if limits.pids_max is not None and "pids" in cg.dirs:
        _write(os.path.join(cg.dirs["pids"], "pids.max"), str(limits.pids_max))
    if DEVICES in cg.dirs:  # a new cgroup starts with its parent's (the job's) devices
        for rule in limits.denied_devices:
            _write(os.path.join(cg.dirs[DEVICES], "devices.deny"), rule)


def denies_devices(hierarchy: Hierarchy) -> bool:
    """Whether instances' device rules are enforced here (cgroup v1's devices files)."""
    return hierarchy.version == 1 and DEVICES in hierarchy.bases


def devices_note(hierarchy: Hierarchy) -> str | None:
    """Said once when GPUs are divided where their devices cannot be denied."""
    if denies_devices(hierarchy):
        return None
    if hierarchy.version == 2:
        why = "on cgroup v2 that takes a BPF device program, which shipyard does not load yet"
    elif hierarchy.version == 1:
        why = "this machine mounts no cgroup v1 devices controller"
    else:
        why = "instances have no cgroups here"
    return (
        "GPUs are divided by CUDA_VISIBLE_DEVICES only: an instance could still open "
        f"another instance's /dev/nvidia* ({why})"
    )


REAPER_SCRIPT = """
read _
i=0
while [ $i -lt 100 ]; do
  gone=1
  for d in "$@"; do
    [ -d "$d" ] || continue
    gone=0
    [ -f "$d/cgroup.procs" ] && for p in $(cat "$d/cgroup.procs"); do kill -9 $p; done
    rmdir "$d" 2>/dev/null
  done
  [ $gone = 1 ] && exit 0
  i=$((i+1))
  sleep 0.1
done
"""


def _start_reaper(dirs: list[str]) -> subprocess.Popen | None:
    """A shell holding a pipe from this process: when the pipe closes (this process
    released the cgroups, or died), it kills what is left in them and removes them."""
    return shellreaper.start(REAPER_SCRIPT, "shipyard-cgroup-reaper", dirs)


def create(job: str, limits: dict[str, Limits], hierarchy: Hierarchy | None = None) -> JobCgroups:
    """The cgroups of a job's instances (``limits``: host -> its limits), with their
    reaper. Raises OSError when the kernel refuses (the caller runs unlimited and says so)."""
    hierarchy = hierarchy or detect()
    if not hierarchy.usable:
        raise OSError(hierarchy.reason)
    sweep(hierarchy)
    launch = next(_LAUNCHES)  # a retry's cgroups are new ones: an old reaper never sees them
    job_dirs: dict[str, str] = {}
    made = JobCgroups(hierarchy, [], {})
    bases = dict(hierarchy.bases)
    if not any(lim.denied_devices for lim in limits.values()):
        bases.pop(DEVICES, None)  # one cgroup fewer per instance when nothing is denied
    try:
        for controller, base in bases.items():
            job_dirs[controller] = _job_dir(hierarchy, controller, base, job, launch)
            made.job_dirs.append(job_dirs[controller])
        for host, lim in limits.items():
            dirs = {}
            for controller, job_dir in job_dirs.items():
                dirs[controller] = os.path.join(job_dir, host)
                _mkdir(dirs[controller])
            cg = InstanceCgroup(host, hierarchy.version, dirs, lim)
            made.instances[host] = cg
            _apply(cg, job_dirs)
    except OSError:
        made.release()
        raise
    made.reaper = _start_reaper(made.all_dirs())
    return made


def job_cgroup_dirs(job: str, hierarchy: Hierarchy | None = None) -> list[str]:
    """Every cgroup directory of ``job`` on this machine (any launcher): what tests count."""
    hierarchy = hierarchy or detect()
    out = []
    for base in hierarchy.bases.values():
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if name.startswith(PREFIX) and name.split(".", 3)[-1] == job:
                out.append(os.path.join(base, name))
    return out
