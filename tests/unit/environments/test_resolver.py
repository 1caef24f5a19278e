"""The framework-version resolver (issue 28, framework environments): asked version + what
the registry has for this Python -> the version that runs, and the sentence that says why."""

from __future__ import annotations

import pytest

from shipyard.environments.resolver import parse, resolve

# tensorflow-cpu releases with a CPython 3.11 wheel, as `pip index versions tensorflow-cpu`
# listed them on 2026-11-27 (2.12 was the first; 2.4.1 has none)
TF_PY311 = [
    "2.12.0",
    "2.12.1",
    "2.13.0",
    "2.13.1",
    "2.14.0",
    "2.14.1",
    "2.15.0",
    "2.15.1",
    "2.16.1",
    "2.16.2",
    "2.17.0",
    "2.17.1",
    "2.18.0",
    "2.18.1",
    "2.19.0",
    "2.19.1",
    "2.20.0",
    "2.21.0",
    "2.22.0rc0",  # a pre-release: never chosen
]


def tf(asked, available=TF_PY311, installed="2.21.0"):
    return resolve("tensorflow", asked, available, installed, "3.11")


def test_nothing_asked_runs_the_installed_environment():
    r = tf(None)
    assert (r.version, r.installed, r.reason, r.requirements) == ("2.21.0", True, None, ())


@pytest.mark.parametrize("asked", ["2.21", "2.21.0"])
def test_the_installed_version_asked_needs_no_environment(asked):
    r = tf(asked)
    assert r.installed and r.exact and r.reason is None and r.requirements == ()


def test_an_exact_version_on_the_registry_is_built():
    r = tf("2.16.1")
    assert (r.version, r.exact, r.installed) == ("2.16.1", True, False)
    assert r.requirements == ("tensorflow-cpu==2.16.1",) and r.reason is None


def test_major_minor_means_its_newest_patch():
    assert tf("2.14").version == "2.14.1"


def test_the_workshops_2_4_1_gets_the_nearest_keras_2_release():
    """No wheel of 2.4.1 for Python 3.11: the nearest release that still has Keras 2 as
    tf.keras and that shipyard supports (2.13+), never the installed 2.21 (Keras 3)."""
    r = tf("2.4.1")
    assert (r.version, r.exact, r.installed) == ("2.13.1", False, False)
    assert r.requirements == ("tensorflow-cpu==2.13.1",)
    assert "no tensorflow-cpu 2.4.1 for Python 3.11" in r.reason
    assert "Keras 2 as tf.keras" in r.reason and "2.13.1" in r.reason


def test_a_keras_2_ask_never_crosses_into_keras_3_even_when_that_is_nearer_by_number():
    r = tf("2.15.3", available=["2.13.1", "2.16.1", "2.21.0"])
    assert r.version == "2.13.1" and "Keras 2" in r.reason


def test_a_keras_3_ask_without_its_wheel_takes_the_nearest_keras_3_one():
    r = tf("2.19.1", available=["2.15.1", "2.18.1", "2.20.0"])
    assert r.version == "2.20.0"  # a tie (one minor either way) goes to the newer
    assert "Keras 3 as tf.keras" in r.reason


def test_the_installed_version_is_chosen_when_it_is_the_nearest():
    r = tf("2.22", available=TF_PY311[:-1])
    assert (r.version, r.installed) == ("2.21.0", True)
    assert r.requirements == () and "2.21.0" in r.reason


def test_a_registry_version_outside_the_supported_range_says_so():
    r = tf("2.12.1")  # it installs, but shipyard's in-instance parts start at 2.13
    assert r.version == "2.13.1"
    assert "outside shipyard's supported TensorFlow 2.13-2.21" in r.reason


def test_a_generation_with_nothing_installable_is_refused_naming_what_is():
    r = tf("2.4.1", available=["2.16.1", "2.21.0"])
    assert r.version is None
    assert "Keras 2 as tf.keras" in r.reason and "2.16.1, 2.21.0" in r.reason


def test_an_unknown_generation_is_refused_with_the_supported_range():
    r = tf("3.0")
    assert r.version is None and "TensorFlow 2.13-2.21" in r.reason


def test_tensorflow_1_with_no_python_to_run_it_is_refused_naming_its_generation():
    r = tf("1.15.5")
    assert r.version is None
    assert "TensorFlow 1: graphs, sessions, tf.contrib" in r.reason and "2.21.0" in r.reason


# what the registry offers the other Pythons of a machine (pyenv's 3.7 and 3.8 here)
ELSEWHERE = {"3.7": ["1.13.1", "1.15.5", "2.1.0", "2.2.0"], "3.8": ["2.2.0", "2.4.1"]}


def test_the_exact_version_runs_in_the_python_it_was_built_for():
    r = resolve("tensorflow", "1.13", TF_PY311, "2.21.0", "3.11", elsewhere=ELSEWHERE)
    assert (r.version, r.exact, r.installed, r.python) == ("1.13.1", True, False, "3.7")
    # TensorFlow 1.x is published as `tensorflow` (CPU-only then), and imports with protobuf 3
    assert r.requirements == ("tensorflow==1.13.1", "protobuf<3.21")
    assert (
        "has no wheel for Python 3.11; running it in Python 3.7, which it was built for" in r.reason
    )
    r = resolve("tensorflow", "2.4.1", TF_PY311, "2.21.0", "3.11", elsewhere=ELSEWHERE)
    assert (r.version, r.python, r.requirements) == (
        "2.4.1",
        "3.8",
        ("tensorflow-cpu==2.4.1", "protobuf<3.21"),
    )


def test_the_asked_py_version_comes_first_then_the_newest_python():
    r = resolve("tensorflow", "2.2", TF_PY311, "2.21.0", "3.11", elsewhere=ELSEWHERE)
    assert r.python == "3.8"
    r = resolve(
        "tensorflow", "2.2", TF_PY311, "2.21.0", "3.11", elsewhere=ELSEWHERE, py_asked="3.7"
    )
    assert r.python == "3.7"


def test_a_version_this_python_has_never_moves_to_another():
    r = resolve("tensorflow", "2.13.1", TF_PY311, "2.21.0", "3.11", elsewhere={"3.10": ["2.13.1"]})
    assert (r.version, r.python) == ("2.13.1", None)


def test_with_no_python_holding_the_exact_version_the_nearest_of_its_generation_runs():
    r = resolve("tensorflow", "2.4.1", TF_PY311, "2.21.0", "3.11", elsewhere={"3.7": ["1.15.5"]})
    assert (r.version, r.exact, r.python) == ("2.13.1", False, None)


@pytest.mark.parametrize("asked", ["latest", "2.4.1rc0", ""])
def test_a_version_that_is_no_version_is_refused(asked):
    r = tf(asked)
    assert r.version is None and repr(asked) in r.reason


def test_pytorch_uses_the_cpu_index():
    r = resolve("pytorch", "2.3.0", ["2.3.0+cpu", "2.13.0+cpu"], "2.13.0", "3.11")
    assert r.requirements == ("torch==2.3.0",)
    assert r.index_url == "https://download.pytorch.org/whl/cpu"


def test_an_unknown_framework_runs_what_is_installed():
    r = resolve("xgboost", "1.7-1", [], None, "3.11")
    assert r.installed and r.version is None


def test_parse():
    assert parse("2.4.1") == (2, 4, 1)
    assert parse("2.21.0+cpu") == (2, 21, 0)
    assert parse("2.22.0rc0") is None and parse("x") is None


def test_an_unreachable_registry_runs_the_installed_release_of_the_same_generation():
    """PyTorch's CPU index is out of reach from many machines: a notebook's '2.1' runs on the
    installed 2.13.0 (PyTorch 2), and the reason names the registry's answer."""
    why = "torch: the registry at http://127.0.0.1:9/simple could not be reached (refused)"
    r = resolve("pytorch", "2.1", [], "2.13.0", "3.11", unreachable=why)
    assert (r.version, r.installed, r.exact) == ("2.13.0", True, False)
    assert r.reason is not None and r.reason.startswith(f"framework_version '2.1' asked: {why}")
    assert (
        "running PyTorch 2.13.0, the nearest with the same API generation (PyTorch 2)" in r.reason
    )


def test_an_unreachable_registry_never_substitutes_another_generation():
    r = resolve("pytorch", "1.13", [], "2.13.0", "3.11", unreachable="unreachable")
    assert r.version is None and r.reason is not None and "unreachable" in r.reason
