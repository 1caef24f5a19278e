"""Bad input: a clear error before anything starts, and nothing written but the refusal."""

from __future__ import annotations

import os

import pytest

import shipyard
from shipyard.errors import DistributionError, JobExistsError, ValidationError


def written(home) -> list[str]:
    """Files a refused submission left (the store and the private-home mark are the home's)."""
    from shipyard.control.home import PRIVATE_MARK

    out = []
    for dirpath, _, files in os.walk(home):
        for f in files:
            if not f.startswith("shipyard.db") and f != PRIVATE_MARK:
                out.append(os.path.relpath(os.path.join(dirpath, f), home))
    return out


@pytest.fixture
def src(write_script):
    return write_script("train.py", "print('ok')\n")


CASES = [
    (dict(entry_point="missing.py"), "entry_point 'missing.py' not found"),
    (dict(source_dir="/nonexistent/dir"), "source_dir '/nonexistent/dir' does not exist"),
    (dict(entry_point="../outside.py"), "outside source_dir"),
    (dict(instance_count=0), "instance_count must be at least 1"),
    (dict(distribution={"bogus": {"enabled": True}}), "unknown distribution key"),
    (
        dict(distribution={"mpi": {"enabled": True}, "parameter_server": {"enabled": True}}),
        "two distributions at once",
    ),
    (dict(hyperparameters={"bad": object()}), "cannot be JSON-encoded"),
    (dict(hyperparameters={"nan": float("nan")}), "cannot be JSON-encoded"),
    (dict(git_config={"repo": "/nonexistent/repo.git"}), "could not clone"),
    (dict(instance_type="ml.nope.big"), "is not known"),
    (
        dict(distribution={"parameter_server": {"enabled": True, "implementation": "byteps"}}),
        "implementation",
    ),
    (dict(metric_definitions=[{"Name": "x", "Regex": "(unclosed"}]), "does not compile"),
    (dict(distribution={"parameter_server": {"enable": True}}), "did you mean 'enabled'"),
    (dict(distribution={"mpi": {"enable": True, "processes_per_host": 2}}), "'enabled'"),
]


@pytest.mark.parametrize("override,message", CASES, ids=[c[1][:30] for c in CASES])
def test_refused_before_anything_starts(session, src, home, tmp_path, override, message):
    (tmp_path / "outside.py").write_text("")
    kwargs = dict(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
    )
    kwargs.update(override)
    with pytest.raises(ValidationError, match=message):
        est = shipyard.Estimator(**kwargs)
        est.fit(job_name="refused-job")
    assert written(home) == []
    assert session.control.list() == []


def test_a_distribution_without_its_runner_is_refused_not_run_plain(
    session, src, home, monkeypatch
):
    from shipyard.jobplan import runners

    monkeypatch.delitem(runners.RULES, "mpi")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
        distribution={"mpi": {"enabled": True}},
    )
    with pytest.raises(ValidationError, match="runner is not available"):
        est.fit(job_name="refused-job")
    assert written(home) == []


def test_channel_that_does_not_exist(session, src, home):
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    with pytest.raises(ValidationError, match="channel 'training': '/no/such/data' does not exist"):
        est.fit("/no/such/data")
    assert written(home) == []


def test_job_name_that_exists(session, src, home):
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="taken")
    before = sorted(written(home))
    with pytest.raises(JobExistsError, match="already exists"):
        est.fit(job_name="taken")
    assert sorted(written(home)) == before
    assert session.control.get("taken").status == "Completed"


def test_smddp_with_the_tensorflow_estimator_is_refused_at_fit(session, src, home):
    """Issue 16 item 5: it was accepted, then failed inside the script with
    "No module named 'smdistributed.dataparallel.tensorflow'". Since issue 28 only where
    SageMaker never had it (TensorFlow 2.12 on): tests/integration/ddp runs it on 2.4.1."""
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        framework_version="2.16",
        session=session,
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
    )
    with pytest.raises(DistributionError, match="dropped TensorFlow from 2.12") as err:
        est.fit(job_name="refused-job")
    assert "'mpi'" in str(err.value) and "multi_worker_mirrored_strategy" in str(err.value)
    assert written(home) == []
    assert session.control.list() == []


def test_distribution_error_is_raised_by_the_constructor(session, src):
    with pytest.raises(DistributionError):
        shipyard.Estimator(
            entry_point="train.py",
            source_dir=src,
            instance_count=1,
            instance_type="local",
            distribution={"mpi": "yes"},
            session=session,
        )


def test_processes_per_host_warning_names_the_distribution_asked(session, src, caplog):
    """Issue 16 item 7: under smdistributed.dataparallel it named torch_distributed."""
    import logging

    est = shipyard.PyTorch(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        session=session,
        distribution={
            "smdistributed": {"dataparallel": {"enabled": True, "processes_per_host": 3}}
        },
    )
    with caplog.at_level(logging.WARNING, logger="shipyard"):
        est.fit(job_name="smddp-ppn")
    warning = [r.getMessage() for r in caplog.records if "processes_per_host" in r.getMessage()]
    assert warning and "smdistributed.dataparallel" in warning[0], warning
    assert "torch_distributed" not in warning[0]


def test_versions_that_differ_from_what_is_installed_are_said_in_one_line(
    session, src, caplog, monkeypatch
):
    """Issue 16 item 7: accepted silently before. With framework environments off (the
    note is what a job on the installed framework gets; on, 2.3 would build TensorFlow
    2.13.1 first: tests/integration/environments covers that)."""
    import logging

    monkeypatch.setenv("SHIPYARD_FRAMEWORK_ENVS", "off")

    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        framework_version="2.3",
        py_version="py37",
        session=session,
    )
    with caplog.at_level(logging.INFO, logger="shipyard"):
        est.fit(job_name="old-versions")
    lines = [r.getMessage() for r in caplog.records if "framework_version '2.3'" in r.getMessage()]
    assert len(lines) == 1 and "py_version 'py37'" in lines[0], lines
