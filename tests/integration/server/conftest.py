"""A real ``shipyard server`` process per module, and the shell environment
``shipyard server env`` prints, applied to this process (what ``eval "$(shipyard server
env)"`` does before a notebook starts). The SDK and boto3 then run unmodified.

The one concession to test time: the SageMaker SDK sleeps 30 s between DescribeEndpoint
polls and 10 s between log polls, and while it tails a training job's logs it asks for the
job's status only once 30 s of ``time.time()`` have passed since it last asked.
``fast_polls`` caps its sleeps at 0.2 s and moves the clock the SDK reads forward by the
part of each sleep it skipped, so the SDK sees the time it asked to sleep go by: the calls
and their order are unchanged (a status check every third log poll instead of every 30 s
of real time, which alone held each ``fit(logs=True)`` up to 30 s after its job ended).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.server.shapes import SHAPES_CHECKED, ShapeRecorder, summary

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, home: str, port: int, host: str = "127.0.0.1", env: dict | None = None):
        self.home, self.port, self.host = home, port, host
        self.log_path = os.path.join(home, "server.out")
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        env = dict(os.environ, SHIPYARD_HOME=self.home, **self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "src")] + [p for p in [env.get("PYTHONPATH")] if p]
        )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shipyard.cli",
                    "server",
                    "--host",
                    self.host,
                    "--port",
                    str(self.port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/_shipyard/health", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()  # never leave a server behind
        raise RuntimeError(f"server did not answer within 60 s: {self.log()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()


def client_env(home: str, port: int) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "server", "env", "--port", str(port)],
        env=dict(os.environ, SHIPYARD_HOME=home, PYTHONPATH=os.path.join(ROOT, "src")),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # what `eval "$(shipyard server env)"` leaves in a shell: the lines run by a real one
    shell = subprocess.run(
        ["bash", "-c", out + "\nenv -0"], capture_output=True, check=True, env=dict(os.environ)
    ).stdout.decode()
    after = dict(item.split("=", 1) for item in shell.split("\0") if "=" in item)
    shells_own = ("_", "SHLVL", "PWD", "OLDPWD")
    return {k: v for k, v in after.items() if os.environ.get(k) != v and k not in shells_own}


def signed_headers(
    url: str, method: str, body: bytes = b"", headers: dict | None = None, service: str = "s3"
) -> dict[str, str]:
    """SigV4 headers (with Host) for a request a test sends by hand, signed with the key in
    this process's environment, as boto3 signs it over http (the body's SHA-256 signed)."""
    from botocore.auth import S3SigV4Auth, SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    signer = S3SigV4Auth if service == "s3" else SigV4Auth
    creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    signer(creds, service, os.environ.get("AWS_DEFAULT_REGION", "us-east-1")).add_auth(request)
    out = dict(request.headers.items())
    out["Host"] = url.split("/")[2]
    return out


def cleanup(home: str) -> None:
    """Whatever the tests left running under ``home``: endpoints and jobs."""
    from shipyard.control.client import ControlPlane
    from shipyard.control.endpoints import Endpoints

    for record in Endpoints(home).list():
        Endpoints(home).delete(record.name, grace=5)
    cp = ControlPlane(home=home)
    for record in cp.list():
        if not record.terminal:
            cp.stop(record.name, timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    """A server on a fresh SHIPYARD_HOME, and this process's environment pointed at it.
    A test module's ``SERVER_ENV`` dict goes to the server and to this process (the local
    mode stand-ins it starts), e.g. ``SHIPYARD_FRAMEWORK_ENVS=off`` where a notebook's
    framework_version is not what the module tests."""
    home = str(tmp_path_factory.mktemp("server-home"))
    extra = dict(getattr(request.module, "SERVER_ENV", {}))
    proc = ServerProcess(home, free_port(), env=extra).start()
    saved = dict(os.environ)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    os.environ.update(client_env(home, proc.port))
    os.environ.update(extra)
    os.environ["SAGEMAKER_SUPPRESS_V2_WARNING"] = "1"
    _reset_clients()
    try:
        yield proc
    finally:
        try:
            cleanup(home)
        finally:
            proc.stop()
            os.environ.clear()
            os.environ.update(saved)
            _reset_clients()


def _reset_clients() -> None:
    """boto3's default session and shipyard's S3 clients cache the old environment."""
    import boto3

    boto3.DEFAULT_SESSION = None
    from shipyard.storage import s3 as s3_store

    s3_store._CLIENTS.clear()


CAP_S = 0.2  # the longest real sleep fast_polls lets the SDK take


@pytest.fixture
def fast_polls(monkeypatch):
    import sagemaker.session

    skipped = 0.0  # seconds the SDK asked to sleep but did not

    class _Time:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            nonlocal skipped
            time.sleep(min(seconds, CAP_S))
            skipped += max(seconds - CAP_S, 0.0)

        @staticmethod
        def time() -> float:
            return time.time() + skipped

        @staticmethod
        def monotonic() -> float:
            return time.monotonic() + skipped

    monkeypatch.setattr(sagemaker.session, "time", _Time())
    yield


_SHAPES: ShapeRecorder | None = None


@pytest.fixture(autouse=True)
def sagemaker_answers_match_botocore_shapes() -> Iterator[None]:
    """Fail a test whose SageMaker calls got an answer that breaks botocore's output shape
    of the operation (shapes.py): required members present, types right."""
    global _SHAPES
    from botocore.history import get_global_history_recorder

    if _SHAPES is None:
        _SHAPES = ShapeRecorder()
        recorder = get_global_history_recorder()
        recorder.add_handler(_SHAPES)
        recorder.enable()
    _SHAPES.take()  # what an earlier test's background threads left is not this test's
    yield
    found = _SHAPES.take()
    if found:
        pytest.fail(
            "shipyard server answered outside botocore's output shape:\n" + "\n".join(found[:20])
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a worker hands its counts to the controller, which prints the
    suite's total (tests/conftest.py): a worker's own terminal summary is never shown."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and _SHAPES is not None:
        workeroutput[SHAPES_CHECKED] = dict(_SHAPES.checked)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many SageMaker answers the shape fixture checked, by operation."""
    if _SHAPES is not None and _SHAPES.checked:
        terminalreporter.write_line(summary(_SHAPES.checked))
