"""The ``bind()`` shim: on a Ray node, no listener of a job binds a wildcard address.

An instance on Ray shares its node's network (the job network does not span the nodes,
docs/sandbox.md), so a server that binds ``0.0.0.0`` or ``[::]`` answers on every
interface of the node. Most of shipyard's listeners bind the node's cluster address
themselves; two cannot be told to: Open MPI's ``prterun``/``prted`` out-of-band listener
and TCP BTL (``*_if_include`` choose the interfaces *advertised*, not the bind address)
and ``tf.distribute.Server`` (gRPC binds ``[::]:<port>``). ``bindshim.c``, loaded with
``LD_PRELOAD`` into every process of a Ray instance, turns a TCP bind to a wildcard into
a bind to ``$SHIPYARD_BIND_ADDRESS`` (the node's cluster address; see the C file for the
IPv6 cases). Ports, source addresses and non-wildcard binds are untouched.

It is C, so it is compiled on the node that needs it, once per source version: ``cc``
builds it into ``<cache>/bindshim-<sha256 of the source>.so`` (a private temporary file,
then an atomic rename, so concurrent builders on one node are safe and a reader never
sees half a file). ``<cache>`` is ``$XDG_CACHE_HOME/shipyard`` (``~/.cache/shipyard``), or
``<tmp>/shipyard-<uid>`` when that cannot be written; it must be the user's own and
writable by nobody else, since whatever lies there is loaded into every process of a job.
Without a compiler the job still runs; ``prepare`` says why its listeners may be on
wildcards, and ``shipyard doctor`` reports it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).with_name("bindshim.c")
ADDRESS_ENV = "SHIPYARD_BIND_ADDRESS"
COMPILE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Shim:
    path: str | None  # the built library; None when it could not be built
    reason: str = ""  # why not (empty when built)
    fix: str = ""


def _cache_dirs() -> list[str]:
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [
        os.path.join(xdg, "shipyard"),
        os.path.join(tempfile.gettempdir(), f"shipyard-{os.geteuid()}"),
    ]


def _private_dir(path: str) -> bool:
    """Create ``path`` (0700) if needed; True when it is ours and nobody else can write it."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        and os.access(path, os.W_OK)
    )


def _compile(compiler: str, source: Path, target: str) -> str:
    """Build ``target`` atomically; '' on success, else the compiler's complaint."""
    fd, tmp = tempfile.mkstemp(prefix=".bindshim-", suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    try:
        proc = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", tmp, str(source), "-ldl", "-lpthread"],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            return f"`{compiler}` failed: {lines[-1] if lines else f'exit {proc.returncode}'}"
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
        return ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{compiler}` failed: {exc}"
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@lru_cache(maxsize=1)
def build() -> Shim:
    """The shim for this node, compiled on first use (cached per source hash)."""
    if os.uname().sysname != "Linux":
        return Shim(None, "LD_PRELOAD bind shims are Linux-only here")
    source = SOURCE.read_bytes()
    name = f"bindshim-{hashlib.sha256(source).hexdigest()[:16]}.so"
    for directory in _cache_dirs():
        if not _private_dir(directory):
            continue
        target = os.path.join(directory, name)
        if os.path.isfile(target):
            return Shim(target)
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            return Shim(
                None,
                "no C compiler (`cc`) on this node to build it",
                "apt-get install gcc (or set CC)",
            )
        error = _compile(compiler, SOURCE, target)
        return Shim(target) if not error else Shim(None, error, "check the compiler (CC)")
    return Shim(
        None,
        f"no private cache directory to build it in ({', '.join(_cache_dirs())})",
        "set XDG_CACHE_HOME to a directory only you can write",
    )


def environment(env: dict[str, str], address: str) -> tuple[dict[str, str], str]:
    """``env`` with the shim preloaded and bound to ``address``, and one line for the log
    that says what listeners will do."""
    shim = build()
    if shim.path is None:
        return env, (
            f"bind shim unavailable ({shim.reason}): listeners that bind a wildcard "
            "(Open MPI, tf.distribute.Server) answer on every address of this node"
        )
    env = dict(env)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{shim.path} {preload}".strip()
    env[ADDRESS_ENV] = address
    return env, f"wildcard listeners bind {address} (bind shim {shim.path})"


def without(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the shim taken out again (LD_PRELOAD's other entries kept)."""
    env = dict(env)
    env.pop(ADDRESS_ENV, None)
    kept = [p for p in env.get("LD_PRELOAD", "").split() if not _is_shim(p)]
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def _is_shim(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith("bindshim-") and name.endswith(".so")
