"""The test suite's own house rules (issue 36): collecting it imports no framework, and the
unit tier's time guard (tests/unit/conftest.py) fails an unmarked test over its budget.

A framework import at a test module's top costs every run that collects it, the edit-test
loop included (TensorFlow alone: 10-30 s); ``tests/lazy.py`` is how a module names one
without importing it."""

from __future__ import annotations

import inspect
import sys

import pytest

from tests.lazy import lazy, needs
from tests.unit import conftest as guard


def test_collecting_the_suite_imports_no_framework() -> None:
    """What this run collected imported no framework: the whole suite under ``make test``
    and CI, the unit tier under ``make test-fast`` (tests/unit/conftest.py notes
    sys.modules when collection finishes, before any test runs; the run is the probe,
    where a fresh interpreter collecting the suite again cost ~11 s of CPU per run)."""
    assert guard.COLLECTED is not None, "tests/unit/conftest.py saw no collection finish"
    loaded, files = guard.COLLECTED
    assert "tests/unit/house/test_collection.py" in files
    assert loaded == [], (
        f"collecting {len(files)} test modules imported {loaded}: a test module imports a "
        "framework at its top (use tests/lazy.py's needs() and lazy(), or import it inside "
        "the test)"
    )


def test_the_collection_probe_names_a_loaded_framework() -> None:
    assert guard.frameworks_in({"os": 1, "json": 1}) == []
    assert guard.frameworks_in({"torch": 1, "numpy": 1, "ray": 1}) == ["ray", "torch"]
    assert guard.frameworks_in({"tensorflow_estimator", "torchvision"}) == []
    assert set(guard.FRAMEWORKS) >= {"tensorflow", "torch", "ray", "keras", "jax"}


def _slow(*args: object) -> pytest.Mark:
    return pytest.mark.slow(*args).mark


def test_an_unmarked_test_over_the_budget_fails_naming_the_way_out() -> None:
    budget = guard.CALL_BUDGET_S
    assert guard.over_budget(budget * 0.9, None, 1.0) is None
    reason = guard.over_budget(budget + 0.5, None, 1.0)
    assert reason is not None
    assert f"{budget + 0.5:.1f} s" in reason and "tests/integration" in reason
    assert '@pytest.mark.slow("why")' in reason


def test_the_budget_grows_with_the_machines_load() -> None:
    budget = guard.CALL_BUDGET_S
    assert guard.over_budget(budget * 3, None, 4.0) is None  # four times slower: allowed
    reason = guard.over_budget(budget * 5, None, 4.0)
    assert reason is not None and "load factor 4.0" in reason
    assert guard.load_factor() >= 1.0


def test_a_slow_mark_exempts_a_test_only_when_it_says_why() -> None:
    assert guard.over_budget(1000.0, _slow("starts a real interpreter"), 1.0) is None
    for bare in (_slow(), _slow(""), _slow(3)):
        reason = guard.over_budget(0.0, bare, 1.0)
        assert reason is not None and "says why" in reason


def test_a_lazy_module_is_imported_by_its_first_use_not_by_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    stand_in = lazy("colorsys")
    # what pytest and inspect ask of every module-level name while collecting
    for attr in ("__test__", "__bases__", "__wrapped__", "_mock_name", "_pytestfixturefunction"):
        assert getattr(stand_in, attr, None) is None
    assert inspect.unwrap(stand_in) is stand_in
    assert "colorsys" not in sys.modules
    assert stand_in.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert "colorsys" in sys.modules


def test_a_missing_package_skips_at_collection_and_on_first_use() -> None:
    assert needs("json").args == (False,)
    missing = needs("json", "no_such_package_of_shipyards")
    assert missing.args == (True,) and "no_such_package_of_shipyards" in missing.kwargs["reason"]
    with pytest.raises(pytest.skip.Exception):
        lazy("no_such_package_of_shipyards").anything  # noqa: B018 - the access is the test
