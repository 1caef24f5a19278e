"""A real S3 API on loopback for the channel tests: moto's server, in a thread.

The agents of a job are separate processes: they reach it over HTTP through
AWS_ENDPOINT_URL_S3, exactly as they would reach MinIO or AWS. Each test gets its own
bucket.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@dataclass
class Bucket:
    client: object
    name: str
    endpoint: str

    def put(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)
        return f"s3://{self.name}/{key}"

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def keys(self, prefix: str = "") -> list[str]:
        resp = self.client.list_objects_v2(Bucket=self.name, Prefix=prefix)
        return sorted(item["Key"] for item in resp.get("Contents", []))

    def uri(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}"


@pytest.fixture
def bucket(s3_endpoint, monkeypatch, home):
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = "bkt-" + uuid.uuid4().hex[:12]
    client.create_bucket(Bucket=name)
    return Bucket(client, name, s3_endpoint)
