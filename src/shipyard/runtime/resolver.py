"""How ``algo-k`` names resolve inside a job on one machine.

Every local instance gets its own loopback address (127.X.Y.k, one /24 per job), so
two instances can both listen on SageMaker's fixed ports (2222, 7777, 8890) and two
concurrent jobs never collide. Python code resolves ``algo-k`` through shipyard's
``sitecustomize`` on the job's PYTHONPATH (shipyard/runtime/sitehooks.py:
socket.getaddrinfo/gethostbyname/gethostname are patched; the user's own sitecustomize
still runs after it). Native
libraries (gloo, MPI, gRPC) resolve names with libc, so runners hand them addresses,
never names.
"""

from __future__ import annotations

HOSTS_ENV = "SHIPYARD_HOSTS"
CURRENT_HOST_ENV = "SHIPYARD_CURRENT_HOST"


def encode(addresses: dict[str, str]) -> str:
    return ",".join(f"{host}={addr}" for host, addr in sorted(addresses.items()))


def decode(text: str) -> dict[str, str]:
    table = {}
    for item in text.split(","):
        host, sep, addr = item.partition("=")
        if sep and host and addr:
            table[host] = addr
    return table


def env_for(addresses: dict[str, str], host: str) -> dict[str, str]:
    return {HOSTS_ENV: encode(addresses), CURRENT_HOST_ENV: host}
