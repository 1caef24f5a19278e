"""The dashboard's guard as pure functions: which ``Host`` names it, which writes may pass.
(The same guard in front of a real server: tests/integration/dashboard.)"""

from __future__ import annotations

import socket

import pytest

from shipyard.dashboard.guard import host_allowed, origin_allowed, own_names, split_host


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("127.0.0.1:8765", "127.0.0.1"),
        ("[::1]:80", "::1"),
        ("LocalHost", "localhost"),
        ("::1", "::1"),
    ],
)
def test_split_host_drops_the_port(header: str, host: str) -> None:
    assert split_host(header) == host


@pytest.mark.parametrize(
    "header",
    ["127.0.0.1:8765", "localhost:8765", "LOCALHOST", "[::1]:8765", "127.0.0.2:8765"],
)
def test_loopback_names_and_addresses_pass_on_loopback(header: str) -> None:
    assert host_allowed(header, "127.0.0.1")


@pytest.mark.parametrize(
    "header",
    [
        "attacker.example:8765",  # DNS rebinding: a foreign name resolved to 127.0.0.1
        "localhost.attacker.example",
        "127.0.0.1.nip.io:8765",
        "10.1.2.3:8765",  # an address the dashboard does not listen on
        "",
        None,
    ],
)
def test_foreign_or_missing_hosts_are_refused_on_loopback(header: str | None) -> None:
    assert not host_allowed(header, "127.0.0.1")


def test_a_name_it_was_started_with_passes_and_only_that() -> None:
    assert host_allowed("dash.internal:80", "dash.internal")
    assert not host_allowed("other.internal:80", "dash.internal")


def test_on_every_address_this_machines_names_and_any_address_pass() -> None:
    assert host_allowed(f"{socket.gethostname()}:8765", "0.0.0.0")
    assert host_allowed("192.168.7.9:8765", "0.0.0.0")
    assert not host_allowed("attacker.example", "0.0.0.0")
    assert "localhost" in own_names("0.0.0.0")


def test_reads_pass_and_writes_only_from_its_own_origin() -> None:
    host = "127.0.0.1:8765"
    assert origin_allowed("GET", "http://attacker.example", "cross-site", host)
    assert origin_allowed("POST", "http://127.0.0.1:8765", "same-origin", host)
    assert not origin_allowed("POST", "http://attacker.example", "cross-site", host)
    assert not origin_allowed("DELETE", "null", None, host)  # a sandboxed frame
    assert not origin_allowed("POST", None, "cross-site", host)  # no Origin, browser says so
    assert origin_allowed("POST", None, None, host)  # curl and scripts: not a browser


def _through_guard(scope_type: str, headers: dict[str, str]) -> tuple[list[dict], bool]:
    """What the guard sends for one connection, and whether the app behind it ran."""
    import asyncio

    from shipyard.dashboard.guard import Guard

    reached = []

    async def app(scope, receive, send):  # the ASGI seam: the dashboard's app sits here
        reached.append(scope["type"])

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": f"{scope_type}.disconnect"}

    scope = {
        "type": scope_type,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "server": ("127.0.0.1", 8765),
    }
    if scope_type == "http":
        scope["method"] = "GET"
    asyncio.run(Guard(app, "127.0.0.1")(scope, receive, send))
    return sent, bool(reached)


def test_websockets_need_its_own_host_and_origin() -> None:
    own = {"Host": "127.0.0.1:8765", "Origin": "http://127.0.0.1:8765"}
    assert _through_guard("websocket", own) == ([], True)
    for headers in (
        {"Host": "attacker.example:8765", "Origin": "http://attacker.example:8765"},
        {"Host": "127.0.0.1:8765", "Origin": "http://attacker.example"},
    ):
        sent, reached = _through_guard("websocket", headers)
        assert sent == [{"type": "websocket.close", "code": 1008}] and not reached


def test_a_foreign_host_gets_421_that_says_where_to_open_it() -> None:
    sent, reached = _through_guard("http", {"Host": "attacker.example:8765"})
    assert not reached and sent[0]["status"] == 421
    assert b"http://127.0.0.1:8765/" in sent[1]["body"]


def test_the_hint_brackets_an_ipv6_address() -> None:
    from shipyard.dashboard.guard import Guard

    async def app(scope, receive, send):  # never reached by hint()
        raise AssertionError

    hint = Guard(app, "::1").hint({"server": ("::1", 8765)})
    assert "http://[::1]:8765/" in hint
    assert host_allowed("[::1]:8765", "::1") and host_allowed("localhost:8765", "::1")
