"""``shipyard server`` under 1,000 concurrent clients (issue 27): mixed S3 GET and PUT and
SageMaker DescribeTrainingJob, each client on its own keep-alive connection.

What a busy team looks like to the server: a few instances' boto3 transfer managers and a
room of notebooks polling their jobs, all at once. Every client connects at the same moment
and sends ``--requests`` requests one after another (reconnecting if the server closed the
connection); a request counts as answered when its whole response arrives within
``--timeout`` seconds. Requests are SigV4-signed once, up front, with the key ``shipyard
server env`` prints (an exact replay inside the signature's window is accepted, as on AWS),
so the client spends its CPU on sockets, not on HMACs: the machine has 2 cores and the
client shares them with the server.

DescribeTrainingJob asks for a job that does not exist: the same store lookup as for one
that does (answered 400 "Requested resource not found."), without a job's processes
competing for the cores during the measurement.

    .venv/bin/python benchmarks/server_load.py                      # this tree
    .venv/bin/python benchmarks/server_load.py --src /tmp/before/src  # another tree's server

Ends with ``RESULT server_load clients=... answered_fraction=... req_per_s=... p50_ms=...
p99_ms=...`` (latencies of answered requests).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _result import result  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET, KEY = "load-bucket", "objects/payload.bin"
BODY = os.urandom(16 << 10)  # what GETs read and PUTs write (16 KiB)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(src: str, home: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, SHIPYARD_HOME=home, PYTHONPATH=src, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "shipyard.cli", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_shipyard/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start within 60 s")


def credentials(src: str, home: str, port: int) -> tuple[str, str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "server", "env", "--port", str(port)],
        env=dict(os.environ, SHIPYARD_HOME=home, PYTHONPATH=src, PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    values = {}
    for line in out.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            values[name] = value.strip("'\"")
    return (
        values.get("AWS_ACCESS_KEY_ID", "shipyard"),
        values.get("AWS_SECRET_ACCESS_KEY", "shipyard-local-secret"),
        values.get("AWS_DEFAULT_REGION", "us-east-1"),
    )


def signed(port: int, creds: tuple[str, str, str]) -> dict[str, bytes]:
    """The three requests, each as the exact bytes sent (signed once)."""
    from botocore.auth import S3SigV4Auth, SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    key, secret, region = creds
    cred = Credentials(key, secret)
    base = f"http://127.0.0.1:{port}"

    def raw(req: AWSRequest, body: bytes) -> bytes:
        path = req.url[len(base) :]
        lines = [f"{req.method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
        for name, value in req.headers.items():
            if name.lower() != "host":
                lines.append(f"{name}: {value}")
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    out = {}
    get = AWSRequest(
        "GET", f"{base}/{BUCKET}/{KEY}", headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    )
    S3SigV4Auth(cred, "s3", region).add_auth(get)
    out["s3_get"] = raw(get, b"")
    put = AWSRequest(
        "PUT",
        f"{base}/{BUCKET}/objects/put.bin",
        data=BODY,
        headers={
            "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            "Content-Type": "application/octet-stream",
        },
    )
    S3SigV4Auth(cred, "s3", region).add_auth(put)
    out["s3_put"] = raw(put, BODY)
    body = b'{"TrainingJobName": "no-such-job"}'
    describe = AWSRequest(
        "POST",
        f"{base}/",
        data=body,
        headers={
            "X-Amz-Target": "SageMaker.DescribeTrainingJob",
            "Content-Type": "application/x-amz-json-1.1",
        },
    )
    SigV4Auth(cred, "sagemaker", region).add_auth(describe)
    out["describe"] = raw(describe, body)
    return out


def prepare(port: int, creds: tuple[str, str, str]) -> None:
    import boto3
    from botocore.config import Config

    key, secret, region = creds
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=region,
        config=Config(s3={"addressing_style": "path"}),
    )
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=BODY)


async def read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return status


async def client(
    index: int, port: int, requests: dict[str, bytes], count: int, timeout: float, out: list
) -> None:
    order = ("s3_get", "describe", "s3_put", "describe", "s3_get")
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    for i in range(count):
        kind = order[(index + i) % len(order)]
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                reader, writer = conn
                writer.write(requests[kind])
                await writer.drain()
                status = await read_response(reader)
            out.append((kind, status, time.monotonic() - start))
        except (
            OSError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ValueError,
        ):
            out.append((kind, None, time.monotonic() - start))
            if conn is not None:
                conn[1].close()
            conn = None
    if conn is not None:
        conn[1].close()


async def load(
    port: int, requests: dict[str, bytes], clients: int, count: int, timeout: float
) -> tuple[list, float]:
    out: list = []
    start = time.monotonic()
    await asyncio.gather(*(client(i, port, requests, count, timeout, out) for i in range(clients)))
    return out, time.monotonic() - start


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=os.path.join(ROOT, "src"), help="the tree whose server runs")
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=5, help="per client, on one connection")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one request may take")
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="server-load-")
    port = free_port()
    proc = start_server(args.src, home, port)
    try:
        creds = credentials(args.src, home, port)
        prepare(port, creds)
        requests = signed(port, creds)
        out, wall = asyncio.run(load(port, requests, args.clients, args.requests, args.timeout))
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        shutil.rmtree(home, ignore_errors=True)
    answered = [r for r in out if r[1] is not None]
    ok = {"s3_get": 200, "s3_put": 200, "describe": 400}  # 400: no such job, as SageMaker
    wrong = [r for r in answered if r[1] != ok[r[0]]]
    latencies = [r[2] * 1000 for r in answered]
    for kind in ok:
        mine = [r for r in out if r[0] == kind]
        got = sum(1 for r in mine if r[1] is not None)
        print(
            f"{kind:9s} {got}/{len(mine)} answered, statuses {sorted({r[1] for r in mine if r[1]})}"
        )
    result(
        "server_load",
        src=os.path.relpath(args.src, ROOT) if args.src.startswith(ROOT) else args.src,
        clients=args.clients,
        requests=len(out),
        answered_fraction=len(answered) / len(out),
        unexpected_status=len(wrong),
        req_per_s=len(answered) / wall,
        p50_ms=percentile(latencies, 0.5),
        p99_ms=percentile(latencies, 0.99),
        wall_s=wall,
    )


if __name__ == "__main__":
    main()
