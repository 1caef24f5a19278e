"""Starting Open MPI's daemons on other machines without ssh (the ``mpi`` runner on Ray).

Open MPI's launcher (prterun) starts one ``prted`` per host by running its rsh agent,
``<agent> <host> <shell command>``, as it would run ``ssh``. On a multi-machine backend
(Ray) the master's mpirun is given this module as that agent:

* ``python -m shipyard.mpi.rsh --plan <master plan> <host> <command...>``
  (client, on the master): connects to the instance at ``host`` (its node IP, from
  ``AgentConfig.addresses``), sends the shell command and the master's rank plan,
  authenticated with the job secret (HMAC-SHA256), relays the command's output and exits
  with its status, as ssh does. For the master's own IP it runs the command itself.
* ``python -m shipyard.mpi.rsh --serve <serve file>`` (every other
  instance's main process, in place of ``mpi_launch --wait``): listens on its own IP,
  port ``SHIPYARD_MPI_RSH_PORT`` (default 7179), and for each authenticated request
  writes the shipped plan with *its own* paths (its instance tree, its process env, its
  run dir: nothing is read from another node's disk), then runs the command under
  ``/bin/sh -c`` in its instance's planned environment plus ``SHIPYARD_MPI_PLAN``, which
  the rank wrapper (mpi_rank) prefers to its ``--plan``. prted's environment reaches the
  ranks it starts, so each rank gets its own instance's SM_* world.

A rank failing on a serving instance writes that instance's failure file; the server
sends it back with the exit status and the client claims the master's failure file with
it (first writer wins), so the job's reason is that rank's message.

The channel runs a shell command, so it is held to: every request answers a fresh
challenge (the server's random nonce and the wall-clock expiry it set, both inside the
HMAC: a recorded request is worthless on any other connection or after ``auth_timeout``);
every frame's announced length is checked against a cap before a byte is read; sockets
time out while unauthenticated; a bounded number of handshakes run at once; every refusal
is logged with the peer's address; the job secret never crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from shipyard import settings
from shipyard.errors import ShipyardError
from shipyard.runtime import failure
from shipyard.runtime.lifeline import parent_death_argv

DEFAULT_PORT = 7179
CONNECT_TIMEOUT_S = 60.0
AUTH_TIMEOUT_S = 10.0  # a peer must answer the challenge within this (default)
MAX_CHALLENGE = 4096
MAX_MAC = 64  # hex SHA-256
MAX_REQUEST = 4 << 20  # the command and the master's rank plan
MAX_REPLY_FRAME = 16 << 20  # output chunks are 64 KiB; failure text 1 KiB
MAX_HANDSHAKES = 16
_HEADER = struct.Struct("!cI")
log = logging.getLogger("shipyard.mpi.rsh")


_HANDSHAKES = threading.BoundedSemaphore(MAX_HANDSHAKES)


class Refused(ShipyardError):
    """A request the server will not run; its text is logged and sent to the peer."""


def port(env: dict[str, str] | os._Environ = os.environ) -> int:
    return settings.integer("SHIPYARD_MPI_RSH_PORT", env)


def _mac(secret: str, payload: bytes) -> str:
    return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


def _send(sock: socket.socket, kind: bytes, data: bytes) -> None:
    sock.sendall(_HEADER.pack(kind, len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


def _recv(sock: socket.socket, limit: int, expect: bytes | None = None) -> tuple[bytes, bytes]:
    """One frame; its announced size is checked against ``limit`` before it is read."""
    kind, size = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if expect is not None and kind != expect:
        raise Refused(f"protocol error: expected a {expect!r} frame, got {kind!r}")
    if size > limit:
        raise Refused(f"frame of {size} bytes announced, at most {limit} accepted")
    return kind, _recv_exact(sock, size)


# -- client ---------------------------------------------------------------------------------
def client(plan_path: str, host: str, command: list[str]) -> int:
    with open(plan_path, encoding="utf-8") as fh:
        plan = json.load(fh)
    rsh = plan["rsh"]
    shell = " ".join(command)
    if host == rsh["self"]:
        os.execv("/bin/sh", ["/bin/sh", "-c", shell])
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            sock = socket.create_connection((host, rsh["port"]), timeout=5)
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                sys.stderr.write(
                    f"shipyard mpi_rsh: no instance answers at {host}:{rsh['port']} "
                    f"after {CONNECT_TIMEOUT_S:g} s: {exc}\n"
                )
                return 255
            time.sleep(0.2)
    try:
        sock.settimeout(AUTH_TIMEOUT_S * 3)
        _, challenge = _recv(sock, MAX_CHALLENGE, b"c")
        issued = json.loads(challenge)
        shipped = {k: v for k, v in plan.items() if k != "rsh"}  # the secret stays here
        payload = json.dumps(
            {
                "nonce": issued["nonce"],
                "expires": issued["expires"],
                "command": shell,
                "plan": shipped,
            }
        ).encode()
        _send(sock, b"m", _mac(rsh["secret"], payload).encode())
        _send(sock, b"p", payload)
        sock.settimeout(None)  # prted runs as long as the job: no idle limit from here
    except (OSError, ValueError, KeyError, Refused) as exc:
        sys.stderr.write(f"shipyard mpi_rsh: handshake with {host} failed: {exc}\n")
        return 255
    while True:
        try:
            kind, data = _recv(sock, MAX_REPLY_FRAME)
        except (OSError, Refused) as exc:
            sys.stderr.write(
                f"shipyard mpi_rsh: the instance at {host} closed the connection ({exc})\n"
            )
            return 255
        if kind == b"o":
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        elif kind == b"f":
            failure.claim(plan["failure_file"], data.decode("utf-8", "replace"))
        elif kind == b"x":
            return int(data)
        elif kind == b"e":
            sys.stderr.write(f"shipyard mpi_rsh: {data.decode()}\n")
            return 255


# -- server ---------------------------------------------------------------------------------
def local_plan(shipped: dict, serve: dict) -> dict:
    """The master's plan with this instance's own paths."""
    plan = dict(shipped)
    plan.pop("rsh", None)
    plan.update(
        instances_dir=serve["instances_dir"],
        master_env=serve["env_file"],
        failure_file=serve["failure_file"],
        run_dir=serve["run_dir"],
    )
    return plan


def _authenticate(conn: socket.socket, serve: dict) -> dict:
    """Challenge, then check the signed answer: the MAC, our nonce, our expiry."""
    timeout = float(serve.get("auth_timeout", AUTH_TIMEOUT_S))
    conn.settimeout(timeout)
    nonce = secrets.token_hex(16)
    expires = round(time.time() + timeout, 3)
    _send(conn, b"c", json.dumps({"nonce": nonce, "expires": expires}).encode())
    _, mac = _recv(conn, MAX_MAC, b"m")
    _, payload = _recv(conn, MAX_REQUEST, b"p")
    if not hmac.compare_digest(mac, _mac(serve["secret"], payload).encode()):
        raise Refused("not signed with this job's secret")
    request = json.loads(payload)
    if request.get("nonce") != nonce or request.get("expires") != expires:
        raise Refused("signed for another challenge (a replayed request)")
    if time.time() > expires:
        raise Refused("the challenge expired before the answer arrived")
    if not isinstance(request.get("command"), str) or not isinstance(request.get("plan"), dict):
        raise Refused("malformed request")
    conn.settimeout(None)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return request


def _handle(conn: socket.socket, peer: str, serve: dict, children: set) -> None:
    try:
        try:
            request = _authenticate(conn, serve)
        finally:
            _HANDSHAKES.release()
        log.info("mpi_rsh: running a command for %s", peer)
        _run(conn, request, serve, children)
    except Refused as exc:
        log.warning("mpi_rsh: refused a request from %s: %s", peer, exc)
        try:
            _send(conn, b"e", f"request refused: {exc}".encode())
        except OSError:
            pass
    except TimeoutError:
        log.warning("mpi_rsh: refused %s: no complete request within the time limit", peer)
    except (OSError, ValueError) as exc:
        log.warning("mpi_rsh: connection from %s failed: %s: %s", peer, type(exc).__name__, exc)
    except Exception:  # noqa: BLE001 - a server thread must log, not vanish
        log.exception("mpi_rsh: request from %s failed", peer)
    finally:
        conn.close()


def _run(conn: socket.socket, request: dict, serve: dict, children: set) -> None:
    plan = local_plan(request["plan"], serve)
    os.makedirs(plan["run_dir"], exist_ok=True)
    if os.path.exists(plan["failure_file"]):
        os.remove(plan["failure_file"])
    plan_path = os.path.join(serve["agent_dir"], "mpi-plan.json")
    with open(plan_path, "w", encoding="utf-8") as fh:
        json.dump(plan, fh)
    with open(serve["env_file"], encoding="utf-8") as fh:
        env = json.load(fh)
    env["SHIPYARD_MPI_PLAN"] = plan_path
    proc = subprocess.Popen(
        parent_death_argv(["/bin/sh", "-c", request["command"]]),
        env=env,
        cwd=serve["cwd"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    children.add(proc)
    threading.Thread(target=_watch_peer, args=(conn, proc), daemon=True).start()
    stdout = proc.stdout
    assert isinstance(stdout, io.BufferedReader)
    for chunk in iter(lambda: stdout.read1(65536), b""):
        _send(conn, b"o", chunk)
    code = proc.wait()
    children.discard(proc)
    try:
        with open(plan["failure_file"], encoding="utf-8") as fh:
            _send(conn, b"f", fh.read().encode())
    except OSError:
        pass
    _send(conn, b"x", str(code if code >= 0 else 128 - code).encode())


def _watch_peer(conn: socket.socket, proc: subprocess.Popen) -> None:
    """The client (mpirun's side) went away: end what it started, as sshd would."""
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def serve(serve_path: str) -> int:
    with open(serve_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    children: set = set()

    def stop(_signum: int, _frame=None) -> None:
        for proc in list(children):
            _kill_group(proc)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="[shipyard-mpi-rsh] %(message)s"
    )
    srv = socket.create_server((spec["ip"], spec["port"]), reuse_port=False)
    while True:
        conn, addr = srv.accept()
        peer = f"{addr[0]}:{addr[1]}"
        if not _HANDSHAKES.acquire(blocking=False):
            log.warning("mpi_rsh: refused %s: %d handshakes already pending", peer, MAX_HANDSHAKES)
            conn.close()
            continue
        threading.Thread(target=_handle, args=(conn, peer, spec, children), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--serve":
        return serve(argv[1])
    if len(argv) >= 4 and argv[0] == "--plan":
        return client(argv[1], argv[2], argv[3:])
    raise SystemExit("usage: python -m shipyard.mpi.rsh --plan FILE HOST COMMAND... | --serve FILE")


if __name__ == "__main__":
    sys.exit(main())
