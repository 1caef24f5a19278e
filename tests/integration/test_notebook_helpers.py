"""shipyard's own SDK answers the first cells of a SageMaker notebook: the role, the
region, the default bucket, upload_data, serializers, v1's s3_input and script_mode."""

from __future__ import annotations

import warnings

import pytest

import shipyard


def test_role_region_bucket_and_upload_to_the_local_store(session, tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert shipyard.get_execution_role().endswith(":role/ShipyardExecutionRole")
    from shipyard.session import get_execution_role as v1_path

    assert v1_path(session) == shipyard.get_execution_role()
    assert session.boto_region_name == "eu-west-1"
    bucket = session.default_bucket()
    assert bucket == "sagemaker-eu-west-1-000000000000"
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "a.csv").write_text("1\n")
    (tmp_path / "data" / "sub" / "b.csv").write_text("2\n")
    uri = session.upload_data(str(tmp_path / "data"), key_prefix="cifar")
    assert uri.startswith("file://") and uri.endswith(f"/{bucket}/cifar")
    root = uri[len("file://") :]
    assert open(f"{root}/a.csv").read() == "1\n" and open(f"{root}/sub/b.csv").read() == "2\n"
    one = session.upload_data(str(tmp_path / "data" / "a.csv"), key_prefix="single")
    assert one.endswith("/single/a.csv")
    with pytest.raises(shipyard.errors.ValidationError, match="does not exist"):
        session.upload_data(str(tmp_path / "missing"))


def test_upload_data_to_an_s3_endpoint(session, tmp_path, monkeypatch):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
        from shipyard.storage import s3 as s3_store

        s3_store._CLIENTS.clear()
        (tmp_path / "x.txt").write_text("hello")
        uri = session.upload_data(str(tmp_path / "x.txt"), key_prefix="d")
        bucket = session.default_bucket()
        assert uri == f"s3://{bucket}/d/x.txt"
        body = s3_store.client().get_object(Bucket=bucket, Key="d/x.txt")["Body"].read()
        assert body == b"hello"
    finally:
        server.stop()
        from shipyard.storage import s3 as s3_store

        s3_store._CLIENTS.clear()


def test_serializers_s3_input_and_script_mode(session, tmp_path):
    from shipyard import deserializers, serializers

    assert serializers.JSONSerializer().serialize([1, 2]) == "[1, 2]"
    assert deserializers.JSONDeserializer().ACCEPT
    with pytest.warns(DeprecationWarning, match="TrainingInput"):
        channel = shipyard.s3_input("s3://bucket/train", distribution="ShardedByS3Key")
    assert isinstance(channel, shipyard.TrainingInput)
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.warns(DeprecationWarning, match="script_mode"):
        shipyard.TensorFlow(
            entry_point=str(tmp_path / "train.py"),
            script_mode=True,
            instance_count=1,
            instance_type="local",
            session=session,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(shipyard.errors.ValidationError, match="script_mode=False"):
            shipyard.TensorFlow(
                entry_point=str(tmp_path / "train.py"),
                script_mode=False,
                instance_count=1,
                instance_type="local",
                session=session,
            )
    assert shipyard.LocalSession is shipyard.Session
