"""The model server calls SavedModel signatures through TensorFlow internals
(serving/tf_eager.py): constraints.txt pins the TensorFlow they are tested with, the adapter
names the same one, and a worker on another TensorFlow says so once, naming both. The
version is faked at the adapter's seam (``warn_if_untested`` takes it)."""

from __future__ import annotations

import logging
import pathlib
import re
from importlib import metadata

import pytest

from shipyard.serving import tf_eager

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_constraints_pin_the_tensorflow_the_adapter_is_tested_with() -> None:
    pins = re.findall(r"^tensorflow-cpu==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pins == [tf_eager.TF_TESTED]


def test_another_tensorflow_is_named_once_with_the_supported_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tf_eager, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="shipyard.serving"):
        tf_eager.warn_if_untested(tf_eager.TF_TESTED)
        assert not caplog.records
        tf_eager.warn_if_untested("2.99.0")
        tf_eager.warn_if_untested("2.99.0")  # a second model in the same worker
    (record,) = caplog.records
    message = record.getMessage()
    assert "tensorflow 2.99.0 is installed" in message
    assert f"tensorflow-cpu=={tf_eager.TF_TESTED}" in message


def test_the_development_environment_runs_the_tested_tensorflow() -> None:
    # the installed distributions' metadata, not ``import tensorflow`` (30 s on a busy machine)
    versions = set()
    for name in ("tensorflow-cpu", "tensorflow"):  # either provides the tensorflow package
        try:
            versions.add(metadata.version(name))
        except metadata.PackageNotFoundError:
            pass
    assert versions == {tf_eager.TF_TESTED}
