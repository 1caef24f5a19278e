"""A TensorFlow parameter_server job asking for a release before 2.4 gets SageMaker's own
TF1 layout (master/worker/ps, the script on every instance); later releases keep the tf2
layout ParameterServerStrategy needs, and a layout the job names always wins (issue 38)."""

from __future__ import annotations

import pytest

from shipyard.jobplan.plan import runner_options_for
from shipyard.spec import validated


def runner_options(spec):
    """agent.json's runner_options for the spec (what JobPlan.runner_options returns)."""
    dist = spec.dist
    raw = dict(dist.options, kind=dist.kind)
    return runner_options_for(dist.runner_for(spec.framework), raw, spec.framework_version)


def _spec(version, options=None, framework="tensorflow"):
    return validated(
        job_name="ps-layout",
        code={"entry_point": "train.py", "source_dir": "/src"},
        instance_count=2,
        framework=framework,
        framework_version=version,
        distribution={"kind": "parameter_server", "options": {"enabled": True, **(options or {})}},
    )


@pytest.mark.parametrize("version", ["1.13", "1.15.5", "2.2", "2.3.4"])
def test_tf1_era_releases_get_sagemakers_layout(version):
    assert runner_options(_spec(version))["layout"] == "sagemaker"


@pytest.mark.parametrize("version", ["2.4.1", "2.13", None])
def test_releases_with_parameter_server_strategy_keep_the_default(version):
    assert "layout" not in runner_options(_spec(version))


def test_a_named_layout_wins():
    assert runner_options(_spec("1.13", {"layout": "tf2"}))["layout"] == "tf2"


def test_shipyard_ps_is_not_a_tensorflow_layout():
    assert "layout" not in runner_options(_spec("2.1", framework="pytorch"))
