"""What a Ray node's instance actor does with the recipe the job's first phase wrote into the
agent config (environments.node.on_node, called by backends/ray/actor.py before the keeper
starts): builds the same environment the same way (the same key as the submitting machine
computes) under the forwarded SHIPYARD_ENVIRONMENTS_DIR, with the job's requirements.txt
from the node's copy of the code bundle, and points the agent's ``python`` at it. Real uv,
the real registry, tiny packages; the Ray cluster test of the same is
tests/integration/ray_backend/test_ray_framework_env.py."""

from __future__ import annotations

import os
import subprocess
import tarfile

import pytest

from shipyard.environments import builder, node

pytest.importorskip("uv")
pytestmark = [pytest.mark.timeout(300)]


def _bundle(tmp_path, requirements: str | None) -> str:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    if requirements is not None:
        (src / "requirements.txt").write_text(requirements)
    path = str(tmp_path / "sourcedir.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for name in os.listdir(src):
            tar.add(src / name, arcname=name)
    return path


def test_a_node_builds_the_recipes_environment_with_the_jobs_requirements(tmp_path):
    root = tmp_path / "node-envs"
    recipe = node.recipe(("six==1.16.0",), (), None, True)
    config = {"submit_directory": _bundle(tmp_path, "idna==3.4\n"), "framework_env": recipe}
    out = node.on_node(config, {"SHIPYARD_ENVIRONMENTS_DIR": str(root)})
    python = out["python"]
    assert python.startswith(str(root)) and out["submit_directory"] == config["submit_directory"]
    versions = subprocess.run(
        [python, "-c", "import six, idna; print(six.__version__, idna.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert versions == ["1.16.0", "3.4"]
    # the key the submitting machine computes for the same recipe and requirements
    key = builder.env_key(("six==1.16.0",), (), None, builder.requirements_digest(b"idna==3.4\n"))
    assert os.path.dirname(os.path.dirname(python)) == str(root / key)
    # a second instance on the node finds it
    again = node.on_node(config, {"SHIPYARD_ENVIRONMENTS_DIR": str(root)})
    assert again["python"] == python


def test_no_recipe_leaves_the_config_as_it_is(tmp_path):
    config = {"submit_directory": "/nowhere", "framework_env": {}, "python": None}
    assert node.on_node(config, {}) == config
