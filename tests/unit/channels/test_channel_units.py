"""Pure parts of the channel code: sharding, framing, listing rules, the Pipe feeder
against a real FIFO reader, and the FUSE mount serving a local store."""

from __future__ import annotations

import gzip
import io
import json
import os
import threading

import pytest

from shipyard import storage
from shipyard.agent.channels import fuse
from shipyard.agent.channels.pipe import FeedError, feed
from shipyard.agent.channels.sharding import shard
from shipyard.data import pipe as pipe_reader
from shipyard.data import recordio
from shipyard.errors import StorageError
from shipyard.storage.s3 import _base_of


def test_shards_are_disjoint_complete_and_numeric_host_order():
    hosts = [f"algo-{i}" for i in range(1, 12)]
    objects = list(range(40))
    parts = [shard(objects, hosts, h) for h in hosts]
    assert sorted(x for part in parts for x in part) == objects
    assert parts[1] == [1, 12, 23, 34]  # algo-2 is index 1 although "algo-10" < "algo-2"


def test_recordio_round_trip_multipart_and_corruption():
    records = [b"", b"a", b"abcd", os.urandom(999)]
    stream = io.BytesIO(b"".join(recordio.wrap(r) for r in records))
    assert list(recordio.read(stream, chunk=7)) == records
    # a dmlc multi-part record: parts joined with the magic put back between them
    parts = [
        recordio.header(2)[:4] + (1 << 29 | 2).to_bytes(4, "little") + b"xy\0\0",
        recordio.header(1)[:4] + (3 << 29 | 1).to_bytes(4, "little") + b"z\0\0\0",
    ]
    assert list(recordio.read(io.BytesIO(b"".join(parts)))) == [b"xy" + recordio.MAGIC_BYTES + b"z"]
    with pytest.raises(recordio.RecordIOError, match="bad RecordIO magic"):
        list(recordio.read(io.BytesIO(b"\0" * 16)))
    with pytest.raises(recordio.RecordIOError, match="ends inside a record"):
        list(recordio.read(io.BytesIO(recordio.wrap(b"abcdef")[:-3])))


def test_prefix_rules_follow_sagemaker():
    assert _base_of("cifar/train", ["cifar/train/a", "cifar/train/b/c"]) == "cifar/train/"
    assert _base_of("data/part", ["data/part-0", "data/part-1"]) == "data/"
    assert _base_of("data/", ["data/x"]) == "data/"
    assert _base_of("", ["x"]) == ""


def test_local_manifest_lists_entries_and_refuses_escapes(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"aa")
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps([{"prefix": f"file://{tmp_path}/d/"}, "a"]))
    objs = storage.list_channel(str(manifest), "ManifestFile")
    assert [(o.relative, o.size) for o in objs] == [("a", 2)]
    manifest.write_text(json.dumps([{"prefix": f"file://{tmp_path}/d/"}, "../m.json"]))
    with pytest.raises(StorageError, match="points outside its prefix"):
        storage.list_channel(str(manifest), "ManifestFile")
    (tmp_path / "empty").mkdir()
    assert storage.list_channel(str(tmp_path / "empty")) == []  # as SageMaker local mode
    manifest.write_text(json.dumps([{"prefix": f"file://{tmp_path}/d/"}]))
    with pytest.raises(StorageError, match="no objects under"):
        storage.list_channel(str(manifest), "ManifestFile")


def _pipe_setup(tmp_path, blobs):
    src = tmp_path / "src"
    src.mkdir()
    for name, data in blobs.items():
        (src / name).write_bytes(data)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    store = storage.store_for(str(src))
    return store, storage.list_channel(str(src)), str(data_dir)


def test_feeder_gzip_recordio_epochs_and_early_close(tmp_path):
    payloads = {"a": b"first object", "b": b"second" * 1000}
    store, objects, data_dir = _pipe_setup(
        tmp_path, {k: gzip.compress(v) for k, v in payloads.items()}
    )
    options = {"CompressionType": "Gzip", "RecordWrapperType": "RecordIO"}
    feeder = threading.Thread(
        target=feed, args=(store, objects, data_dir, "ch", options, 3, lambda m: None), daemon=True
    )
    feeder.start()
    for epoch in range(2):
        with pipe_reader.open_epoch("ch", epoch, data_dir, timeout=10) as fh:
            assert list(recordio.read(fh)) == list(payloads.values())
    with pipe_reader.open_epoch("ch", 2, data_dir, timeout=10) as fh:
        fh.read(3)  # closing early ends the epoch; the feeder must not hang or fail
    feeder.join(timeout=10)
    assert not feeder.is_alive()


def test_feeder_names_a_corrupt_gzip_object(tmp_path):
    store, objects, data_dir = _pipe_setup(tmp_path, {"bad.gz": b"\x1f\x8bnot gzip at all"})
    errors = []

    def run():
        try:
            feed(store, objects, data_dir, "ch", {"CompressionType": "Gzip"}, 1, lambda m: None)
        except FeedError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    fh = pipe_reader.open_epoch("ch", 0, data_dir, timeout=10)
    thread.join(timeout=10)
    fh.close()
    assert errors and "bad.gz is not valid gzip" in errors[0]


def test_epoch_state_is_shared_and_checked(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "inputdataconfig.json").write_text(
        json.dumps({"p": {"TrainingInputMode": "Pipe"}, "f": {"TrainingInputMode": "File"}})
    )
    assert [pipe_reader.next_epoch("p", str(tmp_path / "s")) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(pipe_reader.PipeModeDatasetException, match="is in File mode"):
        pipe_reader.check_channel("f", str(config))
    with pytest.raises(pipe_reader.PipeModeDatasetException, match="not an input of this job"):
        pipe_reader.check_channel("nope", str(config))


@pytest.mark.skipif(fuse.usable() is not None, reason=f"FUSE not usable here: {fuse.usable()}")
def test_fuse_mount_lists_everything_and_reads_on_demand(tmp_path):
    from shipyard.agent.channels.fastfile import mount

    blobs = {"a.bin": os.urandom(300_000), "sub/b.bin": os.urandom(10)}
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name, data in blobs.items():
        (src / name).write_bytes(data)
    objects = storage.list_channel(str(src))
    target = str(tmp_path / "mnt")
    fs, cache = mount(
        storage.store_for(str(src)), objects, target, str(tmp_path / "cache"), "t", print
    )
    try:
        assert sorted(os.listdir(target)) == ["a.bin", "sub"]
        assert os.path.getsize(os.path.join(target, "sub", "b.bin")) == 10
        assert cache.fetched_bytes == 0  # listing and stat fetch nothing
        with open(os.path.join(target, "a.bin"), "rb") as fh:
            fh.seek(1000)
            assert fh.read(5000) == blobs["a.bin"][1000:6000]
        assert cache.fetched_objects == {"a.bin"}
        with pytest.raises(OSError), open(os.path.join(target, "a.bin"), "wb"):
            pass
    finally:
        fs.unmount()


def test_file_mode_staging_logs_bytes_of_total_in_a_bounded_number_of_lines(tmp_path):
    """Two thousand objects downloaded in File mode: a start line, one per ~10 % (or
    5 s), the last; each says bytes done of the total and a rate. Not 2000 lines."""
    from shipyard.agent.channels.file import download_objects

    src = tmp_path / "src"
    src.mkdir()
    for i in range(2000):
        (src / f"part-{i:05d}.bin").write_bytes(b"x" * 500)
    objects = storage.list_channel(str(src))
    lines: list[str] = []
    download_objects(
        storage.store_for(str(src)), objects, str(tmp_path / "dst"), "channel train", lines.append
    )
    assert len(os.listdir(tmp_path / "dst")) == 2000
    assert 2 <= len(lines) <= 13, lines
    assert lines[0] == "channel train: downloading 2000 objects, 1.0 MB"
    assert lines[-1].startswith("channel train: 1.0/1.0 MB (100%), 2000/2000 objects, ")
    assert all(" MB/s, " in line for line in lines[1:])
