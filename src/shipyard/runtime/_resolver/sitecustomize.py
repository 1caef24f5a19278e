"""shipyard: resolve the job's ``algo-k`` host names in Python (see shipyard/agent/resolver.py).

Loaded automatically because the agent puts this directory on PYTHONPATH. Stdlib only,
and it chains to the next ``sitecustomize`` on sys.path so a user's or distro's own
customization still runs.
"""

import os as _os
import sys as _sys


def _install() -> None:
    spec = _os.environ.get("SHIPYARD_HOSTS")
    if not spec:
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


_install()
_chain()
