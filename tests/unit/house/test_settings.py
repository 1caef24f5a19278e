"""Every SHIPYARD_* variable the code names is listed in shipyard.settings, and only
shipyard.settings reads them."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

from shipyard import settings
from shipyard.errors import SettingError, ShipyardError
from tests.unit.sources import parsed

ROOT = pathlib.Path(__file__).resolve().parents[3]
# SHIPYARD_PS_* in prose is a family, not a variable: a name never ends with "_".
NAME = re.compile(r"\bSHIPYARD_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")


def names_in(paths: list[pathlib.Path]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in NAME.findall(line):
                found.setdefault(name, f"{path.relative_to(ROOT)}:{number}")
    return found


def test_every_variable_the_code_names_is_listed() -> None:
    sources = sorted((ROOT / "src" / "shipyard").rglob("*.py"))
    missing = {n: where for n, where in names_in(sources).items() if n not in settings.BY_NAME}
    assert missing == {}, (
        "add these to src/shipyard/settings.py (default and meaning): "
        + ", ".join(f"{n} ({where})" for n, where in sorted(missing.items()))
    )


def test_no_listed_variable_is_dead() -> None:
    sources = sorted((ROOT / "src" / "shipyard").rglob("*.py"))
    used = set(names_in([p for p in sources if p.name != "settings.py"]))
    assert sorted(set(settings.BY_NAME) - used) == []


def test_get_refuses_unlisted_names_and_applies_defaults() -> None:
    assert settings.get("SHIPYARD_STOP_GRACE", {}) == "5"
    assert settings.get("SHIPYARD_STOP_GRACE", {"SHIPYARD_STOP_GRACE": "9"}) == "9"
    try:
        settings.get("SHIPYARD_NOT_A_SETTING", {})
    except KeyError:
        return
    raise AssertionError("an unlisted name was read")


def test_the_scanner_finds_names(tmp_path: pathlib.Path) -> None:
    (tmp_path / "x.py").write_text('os.environ.get("SHIPYARD_NEW_KNOB")  # SHIPYARD_PS_*\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert list(names_in([tmp_path / "x.py"])) == ["SHIPYARD_NEW_KNOB"]
    finally:
        ROOT = saved


# -- settings.py is the one place a SHIPYARD_* variable is read ----------------------------
# The job-process hooks run before shipyard may be importable (a framework environment need
# not have it), stdlib only, in every Python process of a job: they read their variables
# themselves, and nothing else does.
READ_EXEMPT = {
    "runtime/_site/sitecustomize.py",
    "tf/_hook/sitecustomize.py",
    "ddp/_hook/sitecustomize.py",
    "sandbox/init.py",  # an instance's pid 1, run with `python -S`: stdlib only, by design
    "sandbox/launch.py",  # a job process's launcher, `python -I -S`: stdlib only, by design
}


def _constants(trees: dict[str, ast.Module]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """NAME = "SHIPYARD_..." assignments: across the package and per module."""
    every: dict[str, str] = {}
    per: dict[str, dict[str, str]] = {}
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                value = node.value.value
                if isinstance(value, str) and value.startswith("SHIPYARD_"):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            per.setdefault(rel, {})[target.id] = value
                            every.setdefault(target.id, value)
    return every, per


def _is_environ(node: ast.expr, aliases: set[str]) -> bool:
    """``os.environ`` (any name for os), ``environ`` imported from os, or a local alias."""
    if isinstance(node, ast.Attribute) and node.attr == "environ":
        return True
    return isinstance(node, ast.Name) and (node.id == "environ" or node.id in aliases)


def environ_reads(root: pathlib.Path) -> list[str]:
    """Every read of a SHIPYARD_* variable from the process environment under ``root``:
    ``os.environ.get/pop/[...]/setdefault``, ``os.getenv``, ``in os.environ``, also through
    a local name bound to ``os.environ``. Writes into a child's env are not reads."""
    trees = {str(p.relative_to(root)): parsed(p) for p in sorted(root.rglob("*.py"))}
    every, per = _constants(trees)
    found = []
    for rel, tree in trees.items():
        if rel == "settings.py" or rel in READ_EXEMPT:
            continue
        local = {**every, **per.get(rel, {})}

        def name_of(node: ast.expr, local: dict[str, str] = local) -> str | None:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value if node.value.startswith("SHIPYARD_") else None
            if isinstance(node, ast.Name):
                return local.get(node.id)
            if isinstance(node, ast.Attribute):
                return local.get(node.attr)
            return None

        # ``env = os.environ`` or ``env = os.environ if env is None else env``: an alias;
        # ``dict(os.environ)`` is a copy for a child, not the process environment
        aliases = {
            t.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            and (
                _is_environ(n.value, set())
                or (isinstance(n.value, ast.IfExp) and _is_environ(n.value.body, set()))
            )
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            hit = None
            if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
                func = node.func
                if func.attr == "getenv" or (
                    func.attr in ("get", "pop", "setdefault") and _is_environ(func.value, aliases)
                ):
                    hit = name_of(node.args[0])
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                if _is_environ(node.value, aliases):
                    hit = name_of(node.slice)
            elif isinstance(node, ast.Compare) and len(node.ops) == 1:
                if isinstance(node.ops[0], (ast.In, ast.NotIn)) and _is_environ(
                    node.comparators[0], aliases
                ):
                    hit = name_of(node.left)
            if hit:
                found.append(f"{rel}:{node.lineno} reads {hit}")
    return found


def test_only_settings_reads_shipyard_variables() -> None:
    reads = environ_reads(ROOT / "src" / "shipyard")
    assert reads == [], (
        "read these through shipyard.settings (settings.number/integer/text/get...), "
        "so the default and the check live in one entry: " + "; ".join(reads)
    )


def test_the_read_scanner_finds_reads(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.py").write_text(
        "import os\n"
        'KNOB = "SHIPYARD_KNOB"\n'
        'x = os.environ.get("SHIPYARD_A", "5")\n'
        "y = os.environ[KNOB]\n"
        'z = os.getenv("SHIPYARD_B")\n'
        "def f(env=None):\n"
        "    env = os.environ if env is None else env\n"
        '    return "SHIPYARD_C" in env\n'
        'child = dict(os.environ, SHIPYARD_D="1")\n'
        'child["SHIPYARD_E"] = "1"\n'
    )
    reads = environ_reads(tmp_path)
    assert [r.split(" reads ")[1] for r in reads] == [
        "SHIPYARD_A",
        "SHIPYARD_KNOB",
        "SHIPYARD_B",
        "SHIPYARD_C",
    ] or sorted(r.split(" reads ")[1] for r in reads) == [
        "SHIPYARD_A",
        "SHIPYARD_B",
        "SHIPYARD_C",
        "SHIPYARD_KNOB",
    ]


def test_every_default_is_a_value_its_setting_accepts() -> None:
    for s in settings.SETTINGS:
        if s.default is not None:
            s.parse(s.default)  # raises SettingError naming the variable otherwise


def test_typed_accessors_parse_and_refuse_bad_values_by_name() -> None:
    assert settings.number("SHIPYARD_STOP_GRACE", {}) == 5.0
    assert settings.number("SHIPYARD_STOP_GRACE", {"SHIPYARD_STOP_GRACE": "0.5"}) == 0.5
    assert settings.integer("SHIPYARD_DOWNLOAD_THREADS", {"SHIPYARD_DOWNLOAD_THREADS": " 3 "}) == 3
    assert settings.flag("SHIPYARD_HOROVOD_ABORT_ON_ERROR", {}) is True
    assert (
        settings.flag("SHIPYARD_HOROVOD_ABORT_ON_ERROR", {"SHIPYARD_HOROVOD_ABORT_ON_ERROR": "No"})
        is False
    )
    assert settings.text("SHIPYARD_PS_LOG_LEVEL", {"SHIPYARD_PS_LOG_LEVEL": "debug"}) == "DEBUG"
    assert settings.optional_integer("SHIPYARD_TF_INTRA_OP_THREADS", {}) is None
    # an empty value is unset (``VAR= cmd``): the default applies
    assert settings.number("SHIPYARD_STOP_GRACE", {"SHIPYARD_STOP_GRACE": ""}) == 5.0
    bad = {
        "SHIPYARD_STOP_GRACE": "soon",
        "SHIPYARD_DOWNLOAD_THREADS": "0",
        "SHIPYARD_PS_TIMEOUT": "nan",
        "SHIPYARD_HOROVOD_ABORT_ON_ERROR": "maybe",
        "SHIPYARD_PROGRESS": "loud",
    }
    readers = {
        "SHIPYARD_STOP_GRACE": settings.number,
        "SHIPYARD_DOWNLOAD_THREADS": settings.integer,
        "SHIPYARD_PS_TIMEOUT": settings.number,
        "SHIPYARD_HOROVOD_ABORT_ON_ERROR": settings.flag,
        "SHIPYARD_PROGRESS": settings.text,
    }
    for name, value in bad.items():
        with pytest.raises(SettingError) as err:
            readers[name](name, {name: value})  # type: ignore[operator]
        text = str(err.value)
        assert name in text and repr(value) in text and "accepts" in text, text
        assert isinstance(err.value, ShipyardError) and isinstance(err.value, ValueError)


def test_a_required_internal_setting_says_it_is_not_set() -> None:
    with pytest.raises(SettingError, match="SHIPYARD_SERVING_FD is not set"):
        settings.integer("SHIPYARD_SERVING_FD", {})


def test_an_accessor_of_the_wrong_type_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        settings.integer("SHIPYARD_STOP_GRACE", {})


def test_nothing_is_read_at_import_time() -> None:
    """A bad value must not break ``import shipyard...``: it is refused where it is used."""
    env = dict(os.environ, **{s.name: "not a value" for s in settings.SETTINGS if s.kind != "text"})
    modules = ["shipyard.control.supervisor", "shipyard.agent.channels.fastfile"]
    modules += ["shipyard.backends.ray.connect", "shipyard.ps.client", "shipyard.horovod.engine"]
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_doctor_settings_prints_every_setting_its_value_and_source() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHIPYARD_")}
    env.update(SHIPYARD_PS_TIMEOUT="30", SHIPYARD_SERVER_SECRET_KEY="hunter2", COLUMNS="400")
    cmd = [sys.executable, "-m", "shipyard.cli", "doctor", "--settings"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {
        line.split("│")[1].strip(): line
        for line in done.stdout.splitlines()
        if "│ SHIPYARD_" in line
    }
    assert set(settings.BY_NAME) <= set(rows)
    assert [c.strip() for c in rows["SHIPYARD_PS_TIMEOUT"].split("│")[2:4]] == ["30", "env"]
    assert [c.strip() for c in rows["SHIPYARD_STOP_GRACE"].split("│")[2:4]] == ["5", "default"]
    assert "hunter2" not in done.stdout
    env["SHIPYARD_STOP_GRACE"] = "soon"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert (
        done.returncode == 1
        and "SHIPYARD_STOP_GRACE='soon' is not valid" in done.stdout.replace("\n", " ")
    )
