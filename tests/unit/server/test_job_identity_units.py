"""The pure parts of per-job identity (issue 37): what a job inherits of its starter's
environment, which local paths a spec may name, which host paths are never bound, and
what a job's grant covers. The end-to-end behaviour is tests/integration/server/
test_job_identity.py and tests/integration/sandbox/test_spec_paths.py."""

from __future__ import annotations

import io
import os

import pytest

from shipyard.errors import ValidationError
from shipyard.jobplan.inherited import essentials
from shipyard.sandbox import fsview
from shipyard.server.errors import ApiError
from shipyard.server.http import Request
from shipyard.server.job_keys import KeyTable
from shipyard.server.job_policy import check
from shipyard.spec import validated


def test_a_job_inherits_the_essentials_and_no_key():
    env = essentials(
        {
            "PATH": "/usr/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
            "AWS_ACCESS_KEY_ID": "shipyard",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "AWS_SESSION_TOKEN": "t",
            "AWS_PROFILE": "prod",
            "SHIPYARD_HOME": "/home/u/.shipyard",
            "SHIPYARD_SERVER_SECRET_KEY": "k",
            "SHIPYARD_STOP_GRACE": "5",
            "GITHUB_TOKEN": "ghp",
            "LD_PRELOAD": "/tmp/x.so",
        }
    )
    assert env == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "SHIPYARD_STOP_GRACE": "5",
    }


def spec(**fields):
    return validated(job_name="j", code={"entry_point": "t.py"}, **fields)


@pytest.mark.parametrize(
    "path, host_paths, phrase",
    [
        ("relative/ckpt", True, "absolute"),
        ("/opt/ml/checkpoints/../../etc", True, "normalized"),
        ("/opt/ml", True, "directory of its own"),
        ("/opt/ml/input/data", True, "directory of its own"),
        ("/", True, "directory of its own"),
        ("/home/me/ckpt", False, "inside the instance's tree"),
        ("/tmp/ckpt", False, "inside the instance's tree"),
    ],
)
def test_bad_checkpoint_local_paths_are_refused(path, host_paths, phrase):
    with pytest.raises(ValidationError, match="checkpoint_local_path") as info:
        spec(checkpoint_local_path=path, host_paths=host_paths)
    assert phrase in str(info.value)


def test_checkpoint_local_paths_accepted():
    assert spec(checkpoint_local_path="/opt/ml/checkpoints/").checkpoint_local_path == (
        "/opt/ml/checkpoints"
    )
    assert spec(checkpoint_local_path="/opt/ml/ck", host_paths=False).checkpoint_local_path
    assert spec(checkpoint_local_path="/tmp/ck").checkpoint_local_path == "/tmp/ck"


def test_homes_and_shipyard_state_are_hidden(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    (tmp_path / "me").mkdir()
    other = tmp_path / "other"
    (other / "jobs" / "a").mkdir(parents=True)
    (other / "jobs" / "a" / "agent.json").write_text("{}")
    holder = tmp_path / "holder"
    (holder / "h").mkdir(parents=True)
    (holder / "h" / "shipyard.db").write_text("")
    plain = tmp_path / "plain"
    plain.mkdir()
    own = tmp_path / "own-home"
    assert fsview.hidden(str(tmp_path / "me" / "data"))  # inside $HOME
    assert fsview.hidden(str(other)) and fsview.hidden(str(other / "jobs"))  # is, inside
    assert fsview.hidden(str(holder))  # holds one a level down
    assert fsview.hidden(str(own), [str(own)]) and fsview.hidden(str(own / "x"), [str(own)])
    assert not fsview.hidden(str(plain))


def request(method: str, path: str, query: str = "", **headers: str) -> Request:
    return Request(method, path, query, dict(headers), io.BytesIO(), 0)


def split(req: Request) -> tuple[str, str]:
    bucket, _, key = req.path.lstrip("/").partition("/")
    return bucket, key


def test_a_grant_covers_its_prefixes_only(tmp_path):
    status: dict[str, str | None] = {"j": None}
    keys = KeyTable(str(tmp_path / "keys"), {"master": "m"}, lambda job: status[job])
    grant = keys.mint("j", ("b/data/train",), ("b/out/j/", "b/ck/"))
    assert os.stat(tmp_path / "keys" / "j.json").st_mode & 0o777 == 0o600
    token = {"x-amz-security-token": grant.session_token}
    allowed = [
        request("GET", "/b/data/train/rows.csv", **token),
        request("PUT", "/b/out/j/model.tar.gz", **token),
        request("GET", "/b", "list-type=2&prefix=out/j/", **token),
        request("DELETE", "/b/ck/step", **token),
    ]
    for req in allowed:
        check(grant, "s3", req, split)
    refused = [
        request("GET", "/b/out/other/model.tar.gz", **token),  # another job's prefix
        request("PUT", "/b/data/train/x", **token),  # a channel is read-only
        request("GET", "/b", "list-type=2", **token),  # the whole bucket
        request("GET", "/c/x", **token),  # another bucket
        request("GET", "/", **token),  # ListBuckets
        request("PUT", "/b/out/j/x"),  # without its session token
        request("PUT", "/b/out/j/x", **token, **{"x-amz-copy-source": "/b/out/other/m"}),
    ]
    for req in refused:
        with pytest.raises(ApiError) as info:
            check(grant, "s3", req, split)
        assert info.value.code == "AccessDenied" and info.value.status == 403
    with pytest.raises(ApiError) as info:
        check(grant, "sagemaker", request("POST", "/", **token), split)
    assert info.value.code == "AccessDeniedException"
    # the job ends: the key is revoked, for good (a new table reads the same file)
    status["j"] = "Failed"
    revoked = keys.grant(grant.access_key)
    assert revoked is not None and revoked.revoked
    again = KeyTable(str(tmp_path / "keys"), {}, lambda job: None).grant(grant.access_key)
    assert again is not None and "Failed" in str(again.revoked)
    with pytest.raises(ApiError, match="revoked"):
        check(revoked, "s3", allowed[0], split)
