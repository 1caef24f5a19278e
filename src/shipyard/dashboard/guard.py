"""Who may talk to the dashboard: its own name in ``Host``, its own origin on writes.

Why: the dashboard listens on loopback and shows every job's logs and settings, so a
web page must not reach it. A page cannot read another origin's answers, but with DNS
rebinding (``attacker.example`` re-resolved to 127.0.0.1) the browser thinks it is
talking to the attacker's own site and sends ``Host: attacker.example``. Refusing every
``Host`` that is not one of the dashboard's own names closes that. A cross-site form or
``fetch`` may still *send* a write (no preflight for ``text/plain``): anything but
GET/HEAD must come from the dashboard's own origin.

An IP address in ``Host`` is never a rebinding (the browser's origin is then that
address itself), so the addresses the dashboard listens on are accepted as they are.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
WILDCARDS = ("", "0.0.0.0", "::")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def split_host(header: str) -> str:
    """The name or address of a ``Host`` header, without its port (``[::1]:80`` -> ``::1``)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def own_names(bind: str) -> frozenset[str]:
    """The names the dashboard answers to when listening on ``bind``: the name it was
    given, and on loopback or every address, ``localhost``; on every address also this
    machine's own host names (what a colleague's browser uses)."""
    names = {bind.lower()} if _ip(bind) is None and bind not in WILDCARDS else set()
    ip = _ip(bind)
    if bind in WILDCARDS or bind.lower() in LOOPBACK_NAMES or (ip is not None and ip.is_loopback):
        names.update(LOOPBACK_NAMES)
    if bind in WILDCARDS:
        names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
    return frozenset(names)


def host_allowed(header: str | None, bind: str, names: frozenset[str] | None = None) -> bool:
    """Whether a request's ``Host`` names this dashboard (see the module's why)."""
    if not header:
        return False
    host = split_host(header)
    ip = _ip(host)
    if ip is not None:
        bound = _ip(bind)
        return (
            bind in WILDCARDS
            or ip == bound
            or (ip.is_loopback and bool(bound and bound.is_loopback))
        )
    return host in (names if names is not None else own_names(bind))


def origin_allowed(method: str, origin: str | None, fetch_site: str | None, host: str) -> bool:
    """Whether a request may change state: reads always; writes only from the
    dashboard's own origin (``Origin``, else the browser's ``Sec-Fetch-Site``)."""
    if method.upper() in SAFE_METHODS:
        return True
    if origin is not None:
        return origin.lower() in (f"http://{host.lower()}", f"https://{host.lower()}")
    return fetch_site in (None, "same-origin", "none")


class Guard:
    """ASGI middleware: a foreign ``Host`` gets 421, a cross-site write 403, each with a
    JSON body that says what to do instead."""

    def __init__(self, app: ASGIApp, bind: str) -> None:
        self.app = app
        self.bind = bind
        self.names = own_names(bind)

    def hint(self, scope: Scope) -> str:
        port = (scope.get("server") or ("", 0))[1]
        name = "127.0.0.1" if self.bind in WILDCARDS else self.bind
        name = f"[{name}]" if ":" in name else name  # an IPv6 address in a URL
        return f"open it as http://{name}:{port}/ (or start it with --host NAME)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host")
        # a WebSocket is never preflighted: it is checked as a write would be
        method = scope.get("method", "WEBSOCKET")
        own_host = host_allowed(host, self.bind, self.names)
        same_site = origin_allowed(
            method, headers.get("origin"), headers.get("sec-fetch-site"), host or ""
        )
        if scope["type"] == "websocket" and not (own_host and same_site):
            await send({"type": "websocket.close", "code": 1008})
        elif not own_host:
            message = f"Host {host!r} is not this dashboard's name: {self.hint(scope)}"
            await _refuse(send, 421, message)
        elif not same_site:
            origin = headers.get("origin") or headers.get("sec-fetch-site")
            await _refuse(send, 403, f"cross-site {method} from {origin!r} refused")
        else:
            await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
