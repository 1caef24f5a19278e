"""shipyard: the ``sitecustomize`` of every job process (see shipyard/runtime/sitehooks.py).

Loaded automatically because the agent puts this directory on every job process's
PYTHONPATH. Stdlib only, and it chains to the next ``sitecustomize`` on sys.path so a
user's or distro's own customization still runs. It installs two things:

* algo-k name resolution in Python, for instances that are not sandboxed
  (``SHIPYARD_PYTHON_RESOLVER=1``; a sandbox resolves them in libc through /etc/hosts);
* the gloo exit guard: at exit, a process that still has torch's gloo worker threads
  lets them drop their last work objects before the interpreter finalizes (see
  ``_guard_gloo_exit``).
"""

import atexit as _atexit
import os as _os
import sys as _sys


def _install_resolver() -> None:
    spec = _os.environ.get("SHIPYARD_HOSTS")
    if not spec or _os.environ.get("SHIPYARD_PYTHON_RESOLVER") != "1":
        return
    table = {}
    for item in spec.split(","):
        host, sep, addr = item.partition("=")
        if sep:
            table[host] = addr
    reverse = {addr: host for host, addr in table.items()}
    current = _os.environ.get("SHIPYARD_CURRENT_HOST")
    import socket

    def _map(host):
        if isinstance(host, bytes):
            name = host.decode("latin1")
            return table[name].encode("latin1") if name in table else host
        return table.get(host, host) if isinstance(host, str) else host

    real_getaddrinfo = socket.getaddrinfo
    real_gethostbyname = socket.gethostbyname
    real_gethostbyname_ex = socket.gethostbyname_ex
    real_gethostbyaddr = socket.gethostbyaddr

    def getaddrinfo(host, *args, **kwargs):
        return real_getaddrinfo(_map(host), *args, **kwargs)

    def gethostbyname(host):
        return real_gethostbyname(_map(host))

    def gethostbyname_ex(host):
        if host in table:
            return host, [], [table[host]]
        return real_gethostbyname_ex(host)

    def gethostbyaddr(ip):
        if ip in table:
            return ip, [], [table[ip]]
        if ip in reverse:
            return reverse[ip], [], [ip]
        return real_gethostbyaddr(ip)

    def _addr(address):
        if isinstance(address, tuple) and address and isinstance(address[0], (str, bytes)):
            return (_map(address[0]),) + address[1:]
        return address

    # socket methods resolve names in C, past socket.getaddrinfo: map them at the call.
    cls = socket.socket
    for method in ("bind", "connect", "connect_ex"):
        real = getattr(cls, method)

        def wrapper(self, address, _real=real):
            return _real(self, _addr(address))

        wrapper.__name__ = method
        setattr(cls, method, wrapper)
    real_sendto = cls.sendto

    def sendto(self, data, *args):
        args = list(args)
        args[-1] = _addr(args[-1])
        return real_sendto(self, data, *args)

    cls.sendto = sendto
    socket.getaddrinfo = getaddrinfo
    socket.gethostbyname = gethostbyname
    socket.gethostbyname_ex = gethostbyname_ex
    socket.gethostbyaddr = gethostbyaddr
    if current:
        socket.gethostname = lambda: current  # as SageMaker's gethostname LD_PRELOAD does


# torch names the threads of a gloo process group's work queue so (c10d ProcessGroupGloo)
_GLOO_WORKER_THREAD = "pt_gloo_runloop"
_GLOO_EXIT_GRACE_S = 0.05


def _gloo_workers() -> int:
    try:
        tasks = _os.listdir("/proc/self/task")
    except OSError:
        return 0
    count = 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == _GLOO_WORKER_THREAD
        except OSError:
            continue
    return count


def _guard_gloo_exit() -> None:
    """Let gloo's worker threads take the GIL once more before the interpreter finalizes.

    torch 2.13's gloo worker drops a finished collective's work object right after it
    wakes the caller. The object's thread-local state holds a Python object (autograd's
    stashed ``contextvars`` context, captured by DDP's allreduce inside ``backward``), so
    dropping it takes the GIL. When the script returns from its last ``barrier()`` or
    ``destroy_process_group()`` before the worker got the GIL, the worker asks for it
    while Python finalizes; CPython then ends the thread with ``pthread_exit``, whose
    unwind through torch's ``noexcept`` destructor calls ``std::terminate``: the rank dies
    of SIGABRT ("terminate called without an active exception") after all its work is
    done, and its job fails. Measured here (benchmarks/gloo_exit.py): 10 of 200 two-rank
    runs of a DDP script that ends with barrier + destroy_process_group, 0 of 200 with
    this guard.

    Registered first, so it runs after every other ``atexit`` handler, still before
    finalization; it sleeps only in a process that has gloo worker threads. Sleeping
    releases the GIL, and a worker waiting for it takes it at once.
    """
    if "torch.distributed" not in _sys.modules or not _gloo_workers():
        return
    import time

    time.sleep(_GLOO_EXIT_GRACE_S)


def _chain() -> None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    others = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install_resolver()
_atexit.register(_guard_gloo_exit)
_chain()
