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
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from shipyard.runtime import failure
from shipyard.runtime.lifeline import die_with_parent

DEFAULT_PORT = 7179
CONNECT_TIMEOUT_S = 60.0
_HEADER = struct.Struct("!cI")


def port(env: dict[str, str] | os._Environ = os.environ) -> int:
    return int(env.get("SHIPYARD_MPI_RSH_PORT") or DEFAULT_PORT)


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


def _recv(sock: socket.socket) -> tuple[bytes, bytes]:
    kind, size = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return kind, _recv_exact(sock, size)


# -- client ---------------------------------------------------------------------------------
def client(plan_path: str, host: str, command: list[str]) -> int:
    with open(plan_path, encoding="utf-8") as fh:
        plan = json.load(fh)
    rsh = plan["rsh"]
    shell = " ".join(command)
    if host == rsh["self"]:
        os.execv("/bin/sh", ["/bin/sh", "-c", shell])
    payload = json.dumps({"command": shell, "plan": plan}).encode()
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
    sock.settimeout(None)
    _send(sock, b"m", _mac(rsh["secret"], payload).encode())
    _send(sock, b"p", payload)
    while True:
        try:
            kind, data = _recv(sock)
        except ConnectionError:
            sys.stderr.write(f"shipyard mpi_rsh: the instance at {host} closed the connection\n")
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


def _handle(conn: socket.socket, serve: dict, children: set) -> None:
    try:
        kind, mac = _recv(conn)
        kind2, payload = _recv(conn)
        if (
            kind != b"m"
            or kind2 != b"p"
            or not hmac.compare_digest(mac.decode(), _mac(serve["secret"], payload))
        ):
            _send(conn, b"e", b"request refused: not signed with this job's secret")
            return
        request = json.loads(payload)
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
            ["/bin/sh", "-c", request["command"]],
            env=env,
            cwd=serve["cwd"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )  # noqa: PLW1509
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
    except (OSError, ValueError, ConnectionError):
        pass
    finally:
        conn.close()


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
    srv = socket.create_server((spec["ip"], spec["port"]), reuse_port=False)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_handle, args=(conn, spec, children), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--serve":
        return serve(argv[1])
    if len(argv) >= 4 and argv[0] == "--plan":
        return client(argv[1], argv[2], argv[3:])
    raise SystemExit("usage: python -m shipyard.mpi.rsh --plan FILE HOST COMMAND... | --serve FILE")


if __name__ == "__main__":
    sys.exit(main())
