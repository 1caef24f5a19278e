"""shipyard.runtime.safepath: the host opens a job's tree without following its links.

Each case runs twice: through openat2 (the kernel's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
and through the O_NOFOLLOW-per-component fallback used where openat2 is refused."""

from __future__ import annotations

import errno
import os
import shutil
import tarfile

import pytest

from shipyard.control import artifacts
from shipyard.runtime import safepath


@pytest.fixture(params=["openat2", "components"])
def mode(request, monkeypatch):
    if request.param == "components":
        monkeypatch.setattr(safepath, "_openat2_ok", False)
    else:
        monkeypatch.setattr(safepath, "_openat2_ok", None)
    return request.param


@pytest.fixture
def tree(tmp_path):
    """A job's tree (``tree/``) and a host file outside it the job must not reach."""
    (tmp_path / "tree" / "output").mkdir(parents=True)
    victim = tmp_path / "host" / "secret"
    victim.parent.mkdir()
    victim.write_text("HOST FILE\n")
    return tmp_path / "tree", victim


def test_a_plain_file_below_the_root_is_read_and_written(tree, mode):
    root, _ = tree
    safepath.write_text(str(root), str(root / "output" / "failure"), "boom")
    assert safepath.read_text(str(root), "output/failure") == "boom"
    assert (root / "output" / "failure").read_text() == "boom"
    assert safepath.read_text(str(root), "output/failure", limit=2, tail=True) == "om"
    if mode == "openat2":
        assert safepath._openat2_ok is True  # this kernel has it: the fast path was taken


def test_a_link_at_the_name_is_never_read_through(tree, mode):
    root, victim = tree
    os.symlink(victim, root / "output" / "failure")
    with pytest.raises(OSError) as err:
        safepath.read_text(str(root), str(root / "output" / "failure"))
    assert err.value.errno == errno.ELOOP


def test_a_link_in_a_directory_component_is_never_crossed(tree, mode):
    root, victim = tree
    os.symlink(victim.parent, root / "agent")
    with pytest.raises(OSError):
        safepath.read_text(str(root), str(root / "agent" / "secret"))
    with pytest.raises(OSError):
        safepath.write_text(str(root), str(root / "agent" / "secret"), "job text")
    assert victim.read_text() == "HOST FILE\n"


def test_a_write_replaces_a_planted_link_and_its_temporary_name(tree, mode):
    """failure.tmp -> host file was the escape: the write goes to a fresh O_EXCL file and
    renames over the name, so neither a link at the name nor one at any temporary name is
    written through."""
    root, victim = tree
    os.symlink(victim, root / "output" / "failure")
    os.symlink(victim, root / "output" / "failure.tmp")
    os.symlink(victim, root / "output" / f".failure.{os.getpid()}.tmp")
    safepath.write_text(str(root), str(root / "output" / "failure"), "the job's text")
    assert victim.read_text() == "HOST FILE\n"
    assert not os.path.islink(root / "output" / "failure")
    assert (root / "output" / "failure").read_text() == "the job's text"


def test_append_refuses_a_link_and_a_fifo(tree, mode):
    root, victim = tree
    os.symlink(victim, root / "utilization.jsonl")
    with pytest.raises(OSError):
        safepath.append_bytes(str(root), "utilization.jsonl", b"{}\n")
    os.mkfifo(root / "fifo")
    with pytest.raises(OSError):
        safepath.read_text(str(root), "fifo")  # never blocks on a FIFO the job made
    assert victim.read_text() == "HOST FILE\n"


def test_paths_outside_the_root_are_refused(tree):
    root, victim = tree
    for bad in (str(victim), "../host/secret", "output/../../host/secret"):
        with pytest.raises(ValueError):
            safepath.relative(str(root), bad)


def test_walk_reports_links_without_entering_them(tree, mode):
    root, victim = tree
    model = root / "model"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "w.bin").write_bytes(b"w" * 10)
    (model / "empty").mkdir()
    os.symlink(victim, model / "stolen")
    os.symlink(victim.parent, model / "hostdir")
    os.symlink("sub/w.bin", model / "inside")
    entries = {e.rel: e for e in safepath.walk(str(root), str(model))}
    assert set(entries) == {"sub/w.bin", "empty", "stolen", "hostdir", "inside"}
    assert entries["sub/w.bin"].kind == "file" and entries["sub/w.bin"].size == 10
    assert entries["empty"].kind == "dir"
    assert {entries[k].kind for k in ("stolen", "hostdir", "inside")} == {"link"}
    assert safepath.link_leaves("stolen", str(victim))
    assert safepath.link_leaves("a/b", "../../x") and not safepath.link_leaves("a/b", "../x")
    assert not safepath.link_leaves("inside", "sub/w.bin")


def test_the_top_of_a_walk_being_a_link_yields_nothing(tree, mode):
    root, victim = tree
    os.symlink(victim.parent, root / "model")
    assert list(safepath.walk(str(root), str(root / "model"))) == []


def test_archive_skips_links_out_of_the_tree_and_reads_no_host_file(tree, mode):
    """model.tar.gz from a tree the job salted with links: the host file's content is in
    no member, the links out are named in ``skipped``, a link inside stays a link."""
    root, victim = tree
    model = root / "instances" / "algo-1" / "model"
    model.mkdir(parents=True)
    (model / "weights").write_text("trained")
    os.symlink(victim, model / "stolen")
    os.symlink("weights", model / "alias")
    out = root.parent / "out" / "model.tar.gz"
    result = artifacts.archive_dirs([("algo-1", str(model))], str(out), root=str(root))
    assert result.skipped == [f"algo-1: stolen -> {victim}"]
    with tarfile.open(out) as tar:
        names = {m.name: m for m in tar.getmembers()}
        assert set(names) == {"weights", "alias"}
        assert names["alias"].issym() and names["alias"].linkname == "weights"
        data = tar.extractfile("weights")
        assert data is not None and data.read() == b"trained"


def test_archive_refuses_a_model_dir_that_is_a_link(tree, mode):
    root, victim = tree
    (root / "instances" / "algo-1").mkdir(parents=True)
    os.symlink(victim.parent, root / "instances" / "algo-1" / "model")
    out = root.parent / "out" / "model.tar.gz"
    model = str(root / "instances" / "algo-1" / "model")
    result = artifacts.archive_dirs([("algo-1", model)], str(out), root=str(root))
    assert result.files == 0 and "is a link" in result.skipped[0]


def test_open_record_refuses_a_link_at_the_name(tmp_path):
    target = tmp_path / "target"
    target.write_text("x")
    os.symlink(target, tmp_path / "algo-1.log")
    with pytest.raises(OSError):
        safepath.open_record(str(tmp_path / "algo-1.log"), "rb")
    with pytest.raises(OSError):
        safepath.open_record(str(tmp_path / "algo-1.log"), "a", encoding="utf-8")
    assert target.read_text() == "x"


def test_a_download_into_the_tree_removes_links_an_earlier_attempt_left(tmp_path):
    """A retried attempt downloads again into a tree the first attempt's processes could
    write: a link at the channel, at a directory inside it or at an object's name is
    removed and said, and the object lands in the tree, not in the host directory."""
    from shipyard import storage
    from shipyard.agent.channels.file import download_objects

    src = tmp_path / "bucket"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a")
    (src / "sub" / "b.bin").write_bytes(b"b")
    host = tmp_path / "host"
    host.mkdir()
    (host / "a.bin").write_text("HOST")
    channel = tmp_path / "tree" / "input" / "data"
    channel.mkdir(parents=True)
    os.symlink(host, channel / "train")  # the channel itself
    lines: list[str] = []
    objects = storage.list_channel(str(src))
    download_objects(
        storage.store_for(str(src)), objects, str(channel / "train"), "t", lines.append
    )
    assert not os.path.islink(channel / "train")
    assert (host / "a.bin").read_text() == "HOST" and sorted(os.listdir(host)) == ["a.bin"]
    assert (channel / "train" / "sub" / "b.bin").read_bytes() == b"b"
    # links inside the channel: a directory and a file name
    shutil.rmtree(channel / "train" / "sub")
    os.symlink(host, channel / "train" / "sub")
    os.remove(channel / "train" / "a.bin")
    os.symlink(host / "a.bin", channel / "train" / "a.bin")
    download_objects(
        storage.store_for(str(src)), objects, str(channel / "train"), "t", lines.append
    )
    assert (host / "a.bin").read_text() == "HOST" and sorted(os.listdir(host)) == ["a.bin"]
    assert (channel / "train" / "a.bin").read_bytes() == b"a"
    assert (channel / "train" / "sub" / "b.bin").read_bytes() == b"b"
    assert sum("removed a link the job left" in line for line in lines) == 3


def test_the_config_jsons_of_a_retried_tree_are_not_written_through_links(tmp_path):
    from shipyard.jobplan.config import AgentConfig
    from shipyard.jobplan.layout import build_tree, paths_for

    victim = tmp_path / "victim"
    victim.write_text("HOST")
    config = AgentConfig(
        job_name="j",
        hosts=["algo-1"],
        addresses={"algo-1": "127.0.0.1"},
        instance_type="local",
        num_cpus=1,
        num_gpus=0,
        hyperparameters={"lr": "0.1"},
        input_data_config={},
        channel_sources={},
        submit_directory=str(tmp_path),
        entry_point="train.py",
        instances_dir=str(tmp_path / "job" / "instances"),
    )
    paths = build_tree(config, "algo-1")
    for name in ("hyperparameters.json", "hyperparameters.json.tmp"):
        target = os.path.join(paths.input_config, name)
        if os.path.exists(target):
            os.remove(target)
        os.symlink(victim, target)
    build_tree(config, "algo-1", paths_for(config, "algo-1"))
    assert victim.read_text() == "HOST"
    with open(os.path.join(paths.input_config, "hyperparameters.json")) as fh:
        assert fh.read() == '{"lr": "0.1"}'


def test_checkpoint_sync_uploads_files_and_never_a_link(tmp_path):
    from shipyard.agent.channels.checkpoints import CheckpointSync

    secret = tmp_path / "host-secret"
    secret.write_text("HOST")
    local = tmp_path / "tree" / "checkpoints"
    local.mkdir(parents=True)
    (local / "step-1.pt").write_text("ckpt")
    os.symlink(secret, local / "stolen")
    os.symlink(tmp_path, local / "hostdir")
    lines: list[str] = []
    sync = CheckpointSync(f"file://{tmp_path / 'bucket'}", str(local), None, lines.append)
    assert sync.sync_once() == 1
    assert sync.sync_once() == 0
    assert sorted(os.listdir(tmp_path / "bucket")) == ["step-1.pt"]
    assert (tmp_path / "bucket" / "step-1.pt").read_text() == "ckpt"
    assert sum("not uploading" in line for line in lines) == 2  # each link said once


def test_the_pipe_feeder_never_writes_channel_data_through_a_link(tmp_path):
    """The feeder (root, the host's filesystem) writes into the FIFO the job reads: a job
    that replaced it by a link to a host file, or by a file, gets a refusal, and the host
    file keeps its content."""
    from shipyard.agent.channels.pipe import open_writer

    tree = tmp_path / "tree"
    data = tree / "input" / "data"
    data.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("HOST")
    os.symlink(victim, data / "train_0")
    with pytest.raises(OSError):
        open_writer(str(data / "train_0"), root=str(tree))
    with pytest.raises(OSError):
        open_writer(str(data / "train_0"))
    os.remove(data / "train_0")
    (data / "train_0").write_text("a file, not a FIFO")
    with pytest.raises(OSError, match="not the channel's FIFO"):
        open_writer(str(data / "train_0"), root=str(tree))
    assert victim.read_text() == "HOST"
