"""An instance's own PID namespace: its processes see only each other, and an init reaps.

The agent unshares a PID namespace for its children just before it starts the job's
processes. The first child is the instance's init (shipyard.sandbox.init, pid 1 inside):
it makes a mount namespace of its own with a ``/proc`` of the new PID namespace and the
filesystem view of the job's processes (shipyard.sandbox.fsview), tells the agent it is
ready, and then only reaps the orphans the kernel hands it. Every process the
agent's supervisor starts (the script, MPI ranks, TF and PS servers, Pipe feeders) is
born in that PID namespace: they are all started by one spawner thread, the only one
whose children go there (a thread whose children land in another PID namespace cannot
start threads, and rootless the agent could not switch back to the host's); the job's
processes also join init's mount namespace (their launcher, shipyard.sandbox.launch,
enters ``mount_ns``), so their ``/proc`` lists the instance's processes only, and a host
pid names nothing they can signal.

Why the agent stays outside: it keeps the host's ``/proc`` (its own ``/proc/self``, the
job network holder's namespaces, ``shipyard stacks`` finding every process by host pid
from the host), and nothing the job does can reach it by pid. Why init ignores SIGTERM:
the agent's teardown terminates every descendant and the instance's processes must get
their grace period; init goes last, with the agent (its death signal), and when init
ends the kernel kills whatever is left in the namespace: nothing outlives an instance.
"""

from __future__ import annotations

import os
import queue
import select
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from shipyard.sandbox import kernel, tools

READY_TIMEOUT_S = 10.0
INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init.py")
T = TypeVar("T")


class Spawner:
    """A thread whose children are born in a new PID namespace; ``call`` runs a process
    start there. It lives as long as the agent: the death signal of what it starts fires
    when the starting thread ends."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue]] = queue.Queue()
        started: queue.Queue[OSError | None] = queue.Queue(1)
        threading.Thread(target=self._serve, args=(started,), daemon=True).start()
        error = started.get()
        if error is not None:
            raise error

    def _serve(self, started: queue.Queue) -> None:
        try:
            kernel.unshare(kernel.CLONE_NEWPID)
        except OSError as exc:
            started.put(exc)
            return
        started.put(None)
        while True:
            job, answer = self._jobs.get()
            try:
                answer.put((True, job()))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                answer.put((False, exc))

    def call(self, job: Callable[[], T]) -> T:
        answer: queue.Queue[tuple[bool, Any]] = queue.Queue(1)
        self._jobs.put((job, answer))
        ok, value = answer.get()
        if not ok:
            raise value
        return value


@dataclass
class ProcessNamespace:
    init: subprocess.Popen
    spawner: Spawner

    def spawn(self, start: Callable[[], T]) -> T:
        """``start()`` (a process start) with the new process born in the namespace."""
        return self.spawner.call(start)

    @property
    def mount_ns(self) -> str:
        return f"/proc/{self.init.pid}/ns/mnt"

    def enter_argv(self, argv: list[str], cwd: str | None) -> list[str]:
        """``argv`` run in init's mount namespace through util-linux ``nsenter`` (kept
        for processes whose environment is shipyard's own; a job's go through
        shipyard.sandbox.confine.launch) (the PID namespace it is born in), in
        ``cwd`` (entering a mount namespace resets the working directory).

        The directory is changed to inside the namespace (coreutils ``env --chdir``), not
        by ``nsenter --wd``: nsenter opens that directory before it enters, so the process
        would start in a directory of the agent's mount namespace, from which ``..``
        walks to the host's root, around the whole filesystem view."""
        nsenter, env = tools.find("nsenter"), tools.find("env")
        if nsenter is None or env is None:
            raise OSError("util-linux `nsenter` or coreutils `env` is not installed")
        where = cwd or os.getcwd()
        return [nsenter, f"--mount={self.mount_ns}", "--", env, f"--chdir={where}", "--", *argv]


@dataclass
class Starting:
    """An init on its way (``begin``): it builds its view while the agent stages the
    instance; ``finish`` waits for its answer."""

    init: subprocess.Popen | None
    spawner: Spawner | None
    missing: list[str]


def begin(view: dict | None = None) -> Starting:
    """Start the instance's PID namespace and its init (which builds ``view``) without
    waiting for it. Its mount namespace is a copy of the agent's as it is now: a mount
    the agent makes later (a FastFile channel) is not in it, so such jobs begin after
    their mounts."""
    from shipyard.runtime.lifeline import death_signal_argv
    from shipyard.sandbox import viewbuild

    text = viewbuild.encode_view(expand_patterns(view or {}))
    try:
        spawner = Spawner()
    except OSError as exc:
        return Starting(None, None, [f"no PID namespace: the kernel refused one ({exc.strerror})"])
    init = spawner.call(
        lambda: subprocess.Popen(
            death_signal_argv([sys.executable, "-S", INIT]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env={
                "SHIPYARD_PROCESS_NAME": "instance-init",
                "SHIPYARD_INIT_VIEW": text,
                "PATH": os.defpath,
            },
            cwd="/",
            close_fds=True,
        )
    )
    return Starting(init, spawner, [])


def finish(starting: Starting) -> tuple[ProcessNamespace | None, list[str]]:
    """The instance's PID namespace once its init is ready, or None; and the protections
    that are missing, each with why (the job still runs)."""
    init, spawner = starting.init, starting.spawner
    if init is None or spawner is None:
        return None, starting.missing
    answer = _answer(init)
    word, _, rest = answer.partition(" ")
    if word != "ready":
        init.kill()
        init.wait()
        return None, [f"no PID namespace: the instance's init could not start ({answer})"]
    from shipyard.sandbox import viewbuild

    missing = viewbuild.decode_view(rest).get("missing", [])
    return ProcessNamespace(init, spawner), [f"filesystem: {m}" for m in missing]


def expand_patterns(view: dict) -> dict:
    """``view`` with its glob patterns (``devices`` under /dev, ``secrets``) expanded to
    the paths that exist now, in this mount namespace, which the init's is a copy of:
    the init then needs no ``glob`` (nor the ``re`` behind it) to start."""
    from shipyard.sandbox import viewbuild

    expanded = dict(view)
    if "devices" in view:
        expanded["devices"] = [
            os.path.relpath(path, "/dev")
            for pattern in view["devices"]
            for path in viewbuild.expand(os.path.join("/dev", pattern))
        ]
    if "secrets" in view:
        expanded["secrets"] = [p for pattern in view["secrets"] for p in viewbuild.expand(pattern)]
    return expanded


def _answer(init: subprocess.Popen) -> str:
    assert init.stdout is not None
    ready, _, _ = select.select([init.stdout], [], [], READY_TIMEOUT_S)
    line = init.stdout.readline().decode(errors="replace").strip() if ready else ""
    init.stdout.close()
    return line or f"no answer within {READY_TIMEOUT_S:.0f}s"
