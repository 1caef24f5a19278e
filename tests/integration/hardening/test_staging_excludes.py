"""Issue 20, defect 11: staging never bundles shipyard's own data, and a file that
vanishes while staging is a clear error.

Before the fix a second job's sourcedir.tar.gz held the first job's whole directory
(its agent.json with the job secret included) when SHIPYARD_HOME lay inside source_dir,
and a file gone mid-copy surfaced as a raw shutil.Error traceback.
"""

from __future__ import annotations

import os
import tarfile

import pytest

import shipyard
from shipyard.errors import StagingError


def test_home_output_and_checkpoints_inside_source_dir_are_never_bundled(tmp_path, monkeypatch):
    src = tmp_path / "project"
    src.mkdir()
    (src / "train.py").write_text("print('hello')\n")
    (src / "lib").mkdir()
    (src / "lib" / "util.py").write_text("X = 1\n")
    home = src / ".shipyard"  # what the demo does: SHIPYARD_HOME under the repository
    monkeypatch.setenv("SHIPYARD_HOME", str(home))
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    session = shipyard.Session(home=str(home))
    out = src / "artifacts"
    for job in ("stage-one", "stage-two"):
        est = shipyard.Estimator(
            entry_point="train.py",
            source_dir=str(src),
            instance_count=1,
            instance_type="local",
            session=session,
            output_path=str(out),
            checkpoint_s3_uri=str(src / "ckpt"),
        )
        est.fit(job_name=job, logs=False)
        (src / "ckpt").mkdir(exist_ok=True)
        (src / "ckpt" / "step-1.pt").write_bytes(b"x" * 1000)
    with tarfile.open(out / "stage-two" / "source" / "sourcedir.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == ["lib", "lib/util.py", "train.py"], names


def test_a_file_that_vanishes_while_staging_is_a_clear_error(session, write_script):
    src = write_script("train.py", "print('hello')\n")
    # a name listed by the directory scan whose file is gone when it is copied: exactly
    # what a concurrent job deleting its temp file produces, made deterministic
    os.symlink("tmpabc.tmp", os.path.join(src, "tmpabc.tmp.link"))
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    with pytest.raises(StagingError) as err:
        est.fit(job_name="stage-vanish", logs=False)
    message = str(err.value)
    assert "changed while it was being staged" in message and "tmpabc.tmp.link" in message
    # nothing half-made is left: the name is free again
    assert not os.path.exists(os.path.join(session.control.home.root, "jobs", "stage-vanish"))
