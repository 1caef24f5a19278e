"""Issue 37: the agent's last checkpoint and TensorBoard upload waits for a store that is
briefly away (a restarted ``shipyard server``), as the job's artifact upload does; before,
one refused connection at the job's end failed the instance."""

from __future__ import annotations

import pytest

from shipyard.agent.channels.checkpoints import CheckpointSync
from shipyard.errors import StorageError, StorageUnavailableError


class _AwayThenBack:
    """A store refusing ``away`` uploads (as a restarting server does), then answering."""

    def __init__(self, away: int, error: type[StorageError] = StorageUnavailableError) -> None:
        self.away = away
        self.error = error
        self.keys: list[str] = []

    def upload(self, path: str, location) -> None:
        if self.away > 0:
            self.away -= 1
            raise self.error("Could not connect to the endpoint URL: http://127.0.0.1:1/")
        with open(path, "rb") as fh:
            fh.read()
        self.keys.append(location.uri)


def _sync(tmp_path, store, what="checkpoints"):
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "step-1.pt").write_bytes(b"one")
    (local / "step-2.pt").write_bytes(b"two")
    said: list[str] = []
    sync = CheckpointSync(f"file://{tmp_path / 'bucket'}", str(local), None, said.append, what=what)
    sync.store = store
    return sync, said


@pytest.mark.parametrize("what", ["checkpoints", "tensorboard"])
def test_the_last_pass_waits_for_the_store(tmp_path, monkeypatch, what):
    monkeypatch.setenv("SHIPYARD_UPLOAD_PATIENCE", "30")
    store = _AwayThenBack(away=2)
    sync, said = _sync(tmp_path, store, what)
    sync.finish()
    assert sorted(k.rsplit("/", 1)[-1] for k in store.keys) == ["step-1.pt", "step-2.pt"]
    assert any(s.startswith(f"{what}: waiting for the store") for s in said), said
    assert f"{what}: 2 file(s) uploaded to" in said[-1], said


def test_the_wait_ends_when_the_patience_does(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_UPLOAD_PATIENCE", "0.2")
    sync, _said = _sync(tmp_path, _AwayThenBack(away=10**6))
    with pytest.raises(StorageUnavailableError, match="gave up uploading checkpoints"):
        sync.finish()


def test_an_answer_that_waiting_cannot_change_is_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_UPLOAD_PATIENCE", "30")
    store = _AwayThenBack(away=1, error=StorageError)
    sync, _said = _sync(tmp_path, store)
    with pytest.raises(StorageError):
        sync.finish()
    assert store.away == 0 and store.keys == []
