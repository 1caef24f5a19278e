"""storage.retry.patiently: retries only a store that is away, backs off, says so, and gives
up when the patience is spent or a stop is requested (a fake clock: no real waiting)."""

from __future__ import annotations

import pytest

from shipyard.errors import StorageError, StorageUnavailableError
from shipyard.storage.retry import MAX_DELAY, Patience, patiently


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _away_for(clock: Clock, seconds: float):
    calls = []

    def call() -> str:
        calls.append(clock.now)
        if clock.now < seconds:
            raise StorageUnavailableError("the S3 endpoint http://x did not answer")
        return "done"

    return call, calls


def test_waits_for_the_store_and_says_so():
    clock, said = Clock(), []
    call, calls = _away_for(clock, 20)
    patience = Patience(120, "the job's max_run", said.append)
    assert patiently("uploading s3://b/k", call, patience, clock, clock.sleep) == "done"
    assert clock.now >= 20 and len(calls) > 3
    assert said[0].startswith("waiting for the store: the S3 endpoint http://x did not answer")
    assert "uploading s3://b/k for up to 120 s (the job's max_run)" in said[0]
    assert said[-1].startswith("the store answered again after")
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert gaps == sorted(gaps) and max(gaps) <= MAX_DELAY  # exponential, capped


def test_gives_up_when_the_patience_is_spent():
    clock = Clock()
    call, _ = _away_for(clock, 1e9)
    with pytest.raises(StorageUnavailableError) as info:
        patiently("uploading s3://b/k", call, Patience(30, "max_run"), clock, clock.sleep)
    assert "gave up uploading s3://b/k after waiting 30 s for the store (max_run)" in str(
        info.value
    )
    assert clock.now == pytest.approx(30)


def test_reminds_while_it_waits():
    clock, said = Clock(), []
    call, _ = _away_for(clock, 200)
    patiently("x", call, Patience(600, "", said.append), clock, clock.sleep)
    assert sum(m.startswith("still waiting for the store") for m in said) >= 2


def test_a_stop_request_ends_the_wait():
    clock = Clock()
    call, _ = _away_for(clock, 1e9)
    patience = Patience(3600, "", should_stop=lambda: clock.now >= 5)
    with pytest.raises(StorageUnavailableError, match="a stop was requested"):
        patiently("x", call, patience, clock, clock.sleep)
    assert clock.now < 6


def test_other_storage_errors_are_not_retried():
    clock, calls = Clock(), []

    def call() -> None:
        calls.append(1)
        raise StorageError("bucket 'b' does not exist")

    with pytest.raises(StorageError, match="does not exist"):
        patiently("x", call, Patience(3600), clock, clock.sleep)
    assert calls == [1] and clock.now == 0


def test_no_patience_is_one_try():
    clock = Clock()
    call, calls = _away_for(clock, 1e9)
    with pytest.raises(StorageUnavailableError):
        patiently("x", call, Patience(0), clock, clock.sleep)
    assert len(calls) == 1 and clock.sleeps == []


def test_an_endpoint_that_refuses_connections_is_unavailable(monkeypatch, tmp_path):
    """A real refused connection (a port nobody listens on) is the retryable kind."""
    import socket

    from shipyard.storage import parse
    from shipyard.storage.s3 import S3Store

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("SHIPYARD_S3_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    path = tmp_path / "model.tar.gz"
    path.write_bytes(b"x")
    store = S3Store(f"http://127.0.0.1:{port}")
    with pytest.raises(StorageUnavailableError, match=f"127.0.0.1:{port} did not answer"):
        store.upload(str(path), parse("s3://b/job/output/model.tar.gz"))
