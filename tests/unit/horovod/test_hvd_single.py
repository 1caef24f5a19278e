"""shipyard.horovod in one process, no mpirun (the size-1 engine a script gets when it is not
launched by MPI): API semantics, errors, timeline, the shim's import machinery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shipyard.horovod as hvd


@pytest.fixture
def single(single_rank):
    return hvd


def test_not_initialized_is_a_value_error():
    hvd.shutdown()
    with pytest.raises(hvd.NotInitializedError, match="hvd.init"):
        hvd.rank()
    assert issubclass(hvd.NotInitializedError, ValueError)
    assert not hvd.is_initialized()


def test_collectives_are_identity_with_right_types(single):
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    out = hvd.allreduce(x, op=hvd.Sum)
    assert out is not x and out.dtype == np.int64 and (out == x).all()
    assert (hvd.allreduce(x) == x).all()  # Average over 1 rank
    y = x.astype(np.float32)
    assert hvd.allreduce_(y, op=hvd.Max) is y
    assert (hvd.allgather(x) == x).all()
    assert (hvd.broadcast(x, 0) == x).all()
    assert (hvd.alltoall(x) == x).all()
    out, recv = hvd.alltoall(x, splits=[3])
    assert (out == x).all() and recv.tolist() == [3]
    outs = hvd.grouped_allreduce([x, y, np.float64(2.5)])
    assert [o.dtype for o in outs] == [np.int64, np.float32, np.float64] and float(outs[2]) == 2.5
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}
    assert hvd.allgather_object("x") == ["x"]
    assert (hvd.synchronize(hvd.allreduce_async(y, op=hvd.Sum)) == y).all()
    hvd.barrier()
    assert hvd.join() == 0


def test_prescale_postscale_and_noncontiguous_inplace(single):
    x = np.arange(8, dtype=np.float64).reshape(2, 4)[:, ::2]  # not contiguous
    hvd.allreduce_(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert x.tolist() == [[0.0, 2.0], [4.0, 6.0]]


def test_invalid_arguments_raise_collective_argument_error(single):
    with pytest.raises(hvd.CollectiveArgumentError, match="Average is not defined for bool"):
        hvd.allreduce(np.array([True, False]))
    with pytest.raises(hvd.CollectiveArgumentError, match="splits"):
        hvd.alltoall(np.zeros(3), splits=[2])
    with pytest.raises(hvd.CollectiveArgumentError, match="unsupported dtype"):
        hvd.allreduce(np.array(["a"]), op=hvd.Sum)
    with pytest.raises(ValueError, match="root_rank 3"):
        hvd.broadcast(np.zeros(1), 3)
    with pytest.raises(hvd.UnsupportedError):
        hvd.add_process_set([0])
    assert issubclass(hvd.CollectiveArgumentError, hvd.HorovodInternalError)
    assert (hvd.allreduce(np.ones(2), op=hvd.Sum) == 1).all()  # still usable


def test_adasum_single_rank_identity(single):
    x = np.array([1.0, -2.0, 3.0])
    assert np.allclose(hvd.allreduce(x, op=hvd.Adasum), x)


def test_timeline_written_by_single_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_HOROVOD_BACKEND", "self")
    path = tmp_path / "tl" / "timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(path))
    hvd.init()
    hvd.allreduce(np.ones(4), name="grad")
    hvd.synchronize(hvd.allreduce_async(np.ones(4), name="later"))
    hvd.shutdown()
    events = json.loads(path.read_text())
    names = {
        (e["name"], e.get("args", {}).get("tensor"), e.get("tid")) for e in events if e["ph"] == "X"
    }
    assert ("ALLREDUCE", "grad", 0) in names and ("ALLREDUCE", "later", 1) in names
    assert ("NEGOTIATE_ALLREDUCE", None, 0) in names


def test_grouped_ops_with_an_unnamed_first_tensor(tmp_path, monkeypatch):
    """A fused batch is labelled by its first tensor's name: an unnamed first tensor among
    named ones is labelled "grouped" (it was ``None + " +1"``, a TypeError, before). The
    public API names all tensors or none; the engine's callers may mix them."""
    from shipyard.horovod import engine

    monkeypatch.setenv("SHIPYARD_HOROVOD_BACKEND", "self")
    path = tmp_path / "timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(path))
    hvd.init()
    a, b = np.ones(3, np.float32), np.full(2, 2.0, np.float32)
    out = engine.get().grouped_allreduce([a, b], [None, "b"], op=hvd.Sum)
    assert [o.tolist() for o in out] == [[1.0] * 3, [2.0] * 2]
    engine.get().grouped_broadcast_([a, b], 0, [None, "b"])
    hvd.shutdown()
    events = json.loads(path.read_text())
    labels = {
        (e["name"], e["args"]["tensor"])
        for e in events
        if e.get("name") in ("ALLREDUCE", "BROADCAST")
    }
    assert {("ALLREDUCE", "grouped +1"), ("BROADCAST", "grouped")} <= labels


def test_basics_lists_what_it_re_exports():
    """``from shipyard.horovod.basics import *`` gives every framework module the neutral
    API: the list is written out (type checkers read it), so it must match the imports."""
    from shipyard.horovod import basics

    public = {n for n in vars(basics) if not n.startswith("_")}
    assert set(basics.__all__) == public
    assert all(getattr(basics, n) is getattr(hvd, n) for n in basics.__all__)


def test_mpi_built_reflects_mpi4py():
    try:
        import mpi4py  # noqa: F401

        assert hvd.mpi_built()
    except ImportError:
        assert not hvd.mpi_built()


# ---------------------------------------------------------------- the `horovod` shim
def _run_with_shim(code: str, tmp_path, extra_path: str | None = None, env_extra=None):
    env = dict(os.environ)
    env.pop("OMPI_COMM_WORLD_RANK", None)
    parts = [hvd.shim_path()] + ([extra_path] if extra_path else []) + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=tmp_path,
        timeout=60,
    )


def test_shim_path_holds_a_horovod_package():
    assert os.path.isfile(os.path.join(hvd.shim_path(), "horovod", "__init__.py"))


def test_shim_aliases_modules_to_shipyard(tmp_path):
    p = _run_with_shim(
        """
        import horovod, shipyard.horovod, shipyard.horovod.errors as e
        from horovod.common.exceptions import HorovodInternalError
        import horovod.common
        assert HorovodInternalError is e.HorovodInternalError
        assert horovod.common is shipyard.horovod
        assert shipyard.horovod.errors.__spec__.name == "shipyard.horovod.errors"
        print("version", horovod.__version__)
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert "version 0.28.1+shipyard" in p.stdout
    missing = _run_with_shim("import horovod.spark", tmp_path)
    assert missing.returncode != 0 and "does not provide it" in missing.stderr
    assert p.stderr.count("resolves to shipyard.horovod") == 1


def test_shim_defers_to_a_real_horovod(tmp_path):
    real = tmp_path / "site" / "horovod"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("__version__ = '0.28.1'\nREAL = True\n")
    (real / "torch.py").write_text("WHO = 'real horovod.torch'\n")
    code = """
        import horovod, horovod.torch
        print(horovod.__version__, getattr(horovod, 'REAL', False), horovod.torch.WHO)
    """
    p = _run_with_shim(code, tmp_path, extra_path=str(tmp_path / "site"))
    assert p.returncode == 0, p.stderr
    assert "0.28.1 True real horovod.torch" in p.stdout
    assert "using the installed Horovod" in p.stderr
    forced = _run_with_shim(
        "import horovod; print(horovod.__version__)",
        tmp_path,
        extra_path=str(tmp_path / "site"),
        env_extra={"SHIPYARD_HOROVOD_SHIM": "force"},
    )
    assert forced.returncode == 0 and "0.28.1+shipyard" in forced.stdout, forced.stderr
