"""The pure parts of an endpoint's sandbox (shipyard.control.endpoint_box): its view is a
training instance's with the endpoint's own records out of reach, and the model's
environment is applied only at the last exec."""

from __future__ import annotations

import os

from shipyard.control import endpoint_box


def test_view_hides_the_home_and_keeps_neither_the_tree_nor_the_endpoint_dir(tmp_path):
    home = tmp_path / "home"
    tree = home / "endpoints" / "ep" / "instance"
    tree.mkdir(parents=True)
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    reqs = home / "cache" / "requirements" / "abc"
    view = endpoint_box.endpoint_view(str(tree), str(home), [str(metrics)], [str(reqs)])
    real_home = os.path.realpath(home)
    assert any(real_home == m or real_home.startswith(m + "/") for m in view["mask"])
    assert not [p for p in view["keep_rw"] if p.startswith(real_home)]  # no record reachable
    assert os.path.realpath(metrics) in view["keep_rw"]
    assert os.path.realpath(reqs) in view["keep_ro"]
    assert view["private_tmp"] == ["/tmp"]


def test_environment_is_set_by_the_last_exec_only():
    argv = endpoint_box.last_exec(["python", "-m", "w"], {"LD_PRELOAD": "/x.so", "A": "b=c"})
    assert argv == ["env", "-i", "--", "LD_PRELOAD=/x.so", "A=b=c", "python", "-m", "w"]


def test_env_file_is_private_read_once_and_refuses_a_planted_link(tmp_path):
    endpoint_box.write_env_file(str(tmp_path), {"K": "v"})
    path = tmp_path / endpoint_box.ENV_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert endpoint_box._read_env_file(str(tmp_path)) == {"K": "v"}
    assert not path.exists()
    target = tmp_path / "target"
    target.write_text("{}")
    path.symlink_to(target)
    try:
        endpoint_box.write_env_file(str(tmp_path), {"K": "v"})
    except FileExistsError:
        pass
    else:  # pragma: no cover - the failure this test exists for
        raise AssertionError("wrote through a symlink")
    assert target.read_text() == "{}"
