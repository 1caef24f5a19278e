"""shipyard's TensorFlow server processes import TensorFlow without Keras (issue 36: Keras
3 brings scikit-learn, SciPy and pandas, ~2 s of CPU in every ps/worker server). Shown
here on stand-in packages, as the unit tier imports no framework: a "framework" whose
``__init__`` imports a "keras" inside try/except ImportError, as TensorFlow 2.16+ does."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from shipyard.runtime import tf_import as bare_import

FRAMEWORK = """
import importlib.util
# TensorFlow reads the spec's origin of keras to extend its own __path__
KERAS_AT = importlib.util.find_spec("fakekeras_s36").origin
try:
    import fakekeras_s36.src.optimizers
    WITH_KERAS = True
except ImportError:
    WITH_KERAS = False
"""


@pytest.fixture
def packages(tmp_path, monkeypatch):
    (tmp_path / "fakefw_s36").mkdir()
    (tmp_path / "fakefw_s36" / "__init__.py").write_text(FRAMEWORK)
    keras = tmp_path / "fakekeras_s36"
    (keras / "src").mkdir(parents=True)
    (keras / "__init__.py").write_text("import fakesklearn_s36\n")
    (keras / "src" / "__init__.py").write_text("")
    (keras / "src" / "optimizers.py").write_text("")
    (tmp_path / "fakesklearn_s36.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("fakefw_s36", "fakekeras_s36", "fakekeras_s36.src", "fakekeras_s36.src.optimizers")
    yield names
    for name in names + ("fakesklearn_s36",):
        sys.modules.pop(name, None)


def test_refused_packages_are_found_but_not_imported_and_import_again_afterwards(packages):
    with bare_import.refusing(("fakekeras_s36",)):
        fw = importlib.import_module("fakefw_s36")
    assert fw.WITH_KERAS is False
    assert fw.KERAS_AT.endswith("fakekeras_s36/__init__.py")  # the spec still has its origin
    assert "fakekeras_s36" not in sys.modules and "fakesklearn_s36" not in sys.modules
    assert bare_import._Refuser not in {type(f) for f in sys.meta_path}
    importlib.import_module("fakekeras_s36.src.optimizers")  # a later import works
    assert "fakesklearn_s36" in sys.modules


def test_without_the_refusal_the_framework_pulls_keras_in(packages):
    fw = importlib.import_module("fakefw_s36")
    assert fw.WITH_KERAS is True and "fakesklearn_s36" in sys.modules


def test_the_refusal_ends_when_the_import_fails(packages, tmp_path):
    (tmp_path / "broken_s36.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError), bare_import.refusing(("fakekeras_s36",)):
        importlib.import_module("broken_s36")
    assert bare_import._Refuser not in {type(f) for f in sys.meta_path}
    sys.modules.pop("broken_s36", None)


@pytest.mark.parametrize(
    "version, refused",
    [
        ("2.16.1", True),
        ("2.21.0", True),
        ("3.0.0rc1", True),
        ("2.15.1", False),
        ("1.13.2", False),
        ("2.x", False),
        ("", False),
    ],
)
def test_only_tensorflows_whose_keras_import_is_guarded_are_imported_bare(version, refused):
    assert bare_import.guarded(version) is refused


def test_an_unreadable_version_imports_tensorflow_plainly(monkeypatch):
    seen = []
    monkeypatch.setattr(bare_import, "installed_version", lambda: None)
    monkeypatch.setattr(bare_import, "refusing", lambda names: seen.append(names))
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)  # restored afterwards
    fake = type(sys)("tensorflow")
    real_import = __import__

    def fake_import(name, *args, **kwargs):
        return fake if name == "tensorflow" else real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", fake_import)
    assert bare_import.import_tensorflow() is fake
    assert seen == []
