"""Framework environments are built by real uv from the real package registry (a tiny
pure-Python requirement stands in for a framework, so the test downloads kilobytes):
built once, found in the cache after, built once when two jobs ask together, isolated from
the installed environment, with shipyard importable; a requirement the registry does not
have fails naming it and the registry's answer, leaving nothing behind."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from shipyard.environments import builder

pytest.importorskip("uv")
pytestmark = [pytest.mark.timeout(600)]


def _python(env: builder.Environment, code: str) -> str:
    return subprocess.run(
        [env.python, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def test_built_once_then_found_isolated_and_with_shipyard(tmp_path):
    root = str(tmp_path / "envs")
    first = builder.build(root, ["six==1.16.0"], deps=())
    assert first.built and os.path.isfile(os.path.join(first.path, builder.READY))
    assert _python(first, "import six; print(six.__version__)") == "1.16.0"
    # shipyard's job-side code imports there; the installed environment's packages do not
    assert _python(first, "import shipyard.environments.resolver as r; print(r.__name__)") == (
        "shipyard.environments.resolver"
    )
    assert _python(first, "import importlib.util as u; print(u.find_spec('pydantic'))") == "None"
    again = builder.build(root, ["six==1.16.0"], deps=())
    assert (again.built, again.path) == (False, first.path)


def test_two_jobs_asking_together_build_it_once(tmp_path):
    root = str(tmp_path / "envs")
    with ThreadPoolExecutor(2) as pool:
        envs = list(pool.map(lambda _: builder.build(root, ["six==1.15.0"], deps=()), range(2)))
    assert sorted(e.built for e in envs) == [False, True]
    assert envs[0].path == envs[1].path
    assert [n for n in os.listdir(root) if not n.startswith(".")] == [envs[0].key]


def test_a_requirement_the_registry_lacks_names_it_and_leaves_nothing(tmp_path):
    root = str(tmp_path / "envs")
    missing = "shipyard-no-such-package-28==1.0"
    with pytest.raises(builder.EnvironmentBuildError) as err:
        builder.build(root, [missing], deps=())
    text = str(err.value)
    assert "shipyard-no-such-package-28" in text and "uv exited with" in text
    assert [n for n in os.listdir(root) if not n.startswith(".")] == []


def test_an_environment_in_another_python_of_this_machine(tmp_path):
    """A release built for another Python (TensorFlow 1.13 for 3.7) gets its environment
    there: the interpreter pyenv keeps, shipyard linked into that Python's site-packages,
    its own cache key."""
    from shipyard.environments import interpreters

    if interpreters.find("3.8") is None:
        pytest.skip("no Python 3.8 on this machine (pyenv install 3.8)")
    root = str(tmp_path / "envs")
    env = builder.build(root, ["six==1.16.0"], deps=(), python="3.8")
    assert env.built and "-py3.8-" in env.key
    assert _python(env, "import sys; print('%d.%d' % sys.version_info[:2])") == "3.8"
    assert _python(env, "import shipyard.runtime, six; print(six.__version__)") == "1.16.0"
    mine = builder.build(root, ["six==1.16.0"], deps=())
    assert mine.key != env.key


def test_a_python_this_machine_lacks_is_named_with_how_to_get_it(tmp_path):
    root = str(tmp_path / "envs")
    with pytest.raises(builder.EnvironmentBuildError, match=r"Python 3\.99 is not on this machine"):
        builder.build(root, ["six==1.16.0"], deps=(), python="3.99")
    assert [n for n in os.listdir(root) if not n.startswith(".")] == []
