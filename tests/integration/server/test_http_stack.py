"""``shipyard server``'s HTTP stack as a process: 1,000 clients connecting at once are all
answered (the old listen backlog of 5 left hundreds unanswered), and SIGTERM ends the
server promptly even with an upload stalled in the middle of its body."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

from tests.integration.server.conftest import ServerProcess, client_env, free_port

GUARD = 60.0  # hang guard, never the thing measured


def signed_list_request(home: str, port: int) -> bytes:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    env = client_env(home, port)
    body = b"{}"
    req = AWSRequest(
        method="POST",
        url=f"http://127.0.0.1:{port}/",
        data=body,
        headers={
            "X-Amz-Target": "SageMaker.ListTrainingJobs",
            "Content-Type": "application/x-amz-json-1.1",
        },
    )
    creds = Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    SigV4Auth(creds, "sagemaker", env.get("AWS_DEFAULT_REGION", "us-east-1")).add_auth(req)
    lines = ["POST / HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in req.headers.items() if k.lower() != "host"]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_a_thousand_clients_at_once_are_all_answered(tmp_path):
    proc = ServerProcess(str(tmp_path), free_port()).start()
    try:
        listing = signed_list_request(str(tmp_path), proc.port)
        health = b"GET /_shipyard/health HTTP/1.1\r\nHost: x\r\n\r\n"

        async def one(i: int) -> bytes:
            try:
                async with asyncio.timeout(GUARD):
                    reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
                    writer.write(listing if i % 2 else health)
                    await writer.drain()
                    line = await reader.readline()
                    writer.close()
                    return line
            except (OSError, TimeoutError) as exc:
                return repr(exc).encode()

        async def all_of_them() -> list[bytes]:
            return await asyncio.gather(*(one(i) for i in range(1000)))

        lines = asyncio.run(all_of_them())
        bad = [line for line in lines if b" 200 " not in line]
        assert not bad, f"{len(bad)} of 1000 not answered 200, e.g. {bad[:3]}"
    finally:
        proc.stop()


def test_sigterm_ends_the_server_with_an_upload_stalled_mid_body(tmp_path):
    import boto3

    proc = ServerProcess(str(tmp_path), free_port()).start()
    env = client_env(str(tmp_path), proc.port)
    boto3.client(
        "s3",
        endpoint_url=proc.url,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
    ).create_bucket(Bucket="bucket")
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    # signed (every request must be), its payload unsigned as S3 allows: the server reads
    # the body as it streams instead of refusing the request at its head
    signing = AWSRequest(
        method="PUT",
        url=f"{proc.url}/bucket/key",
        headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD", "Content-Length": "50000000"},
    )
    S3SigV4Auth(
        Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]),
        "s3",
        env.get("AWS_DEFAULT_REGION", "us-east-1"),
    ).add_auth(signing)
    head = "".join(f"{k}: {v}\r\n" for k, v in signing.headers.items())
    conn = socket.create_connection(("127.0.0.1", proc.port), timeout=GUARD)
    try:
        conn.sendall(
            f"PUT /bucket/key HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\n{head}\r\n".encode()
            + b"a" * 2_000_000
        )
        time.sleep(0.5)
        conn.settimeout(0.5)
        try:  # still reading the body: no answer yet
            assert conn.recv(100) == b"", "the server answered a body it had not read"
        except TimeoutError:
            pass
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGTERM)
        proc.proc.wait(GUARD)  # raises TimeoutExpired if the server hangs
    finally:
        conn.close()
        proc.stop()
