"""The Keras 3 multi-worker ``model.fit`` fix: loaded by the hook when asked, lazily, and
applied by what Keras' code says rather than by version.

Real Keras, in a subprocess each (the hook and the patch act on a whole process). The
multi-worker behaviour itself is exercised end to end by tests/integration/tfdist
(two instances, a plain ``model.fit``, identical weights on both workers).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shipyard.tf import keras_compat

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))
HOOK = os.path.join(SRC, "shipyard", "tf", "_hook")
pytestmark = pytest.mark.tensorflow


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != keras_compat.COMPAT_ENV}
    full.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join([HOOK, SRC]), **env)
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=full,
        timeout=240,
    )


def test_the_hook_fixes_this_keras_once_the_script_imports_it():
    proc = run(
        "import sys\n"
        "assert 'keras' not in sys.modules and 'tensorflow' not in sys.modules\n"
        "import keras\n"
        "from keras.src.backend.tensorflow import trainer\n"
        "assert hasattr(trainer.TensorFlowTrainer._maybe_symbolic_build, '__wrapped__')\n"
        "assert hasattr(trainer.reduce_per_replica, '__wrapped__')\n"
        "assert all(hasattr(getattr(trainer.TensorFlowTrainer, m), '__wrapped__')\n"
        "           for m in ('fit', 'evaluate', 'predict'))\n"
        "print('ok')\n",
        **{keras_compat.COMPAT_ENV: "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
    lines = [x for x in proc.stderr.splitlines() if x.startswith("shipyard:")]
    assert len(lines) == 1 and keras_compat.ISSUE in lines[0], proc.stderr[-2000:]
    assert "first batch built locally" in lines[0] and "axis=None" in lines[0]
    assert "steps_per_execution > 1 run as 1" in lines[0]


def test_nothing_without_the_variable_and_a_fixed_keras_is_left_alone():
    proc = run(
        "from keras.src.backend.tensorflow import trainer\n"
        "from shipyard.tf import keras_compat\n"
        "assert not hasattr(trainer.reduce_per_replica, '__wrapped__')  # hook not asked\n"
        "orig = trainer.TensorFlowTrainer._maybe_symbolic_build\n"
        "def fixed(self, iterator=None, data_batch=None):\n"
        "    return orig(self, iterator, data_batch)\n"
        "trainer.TensorFlowTrainer._maybe_symbolic_build = fixed\n"
        "trainer.reduce_per_replica = lambda values, strategy, reduction: values\n"
        "trainer.TensorFlowTrainer._make_function = lambda self, step_function: None\n"
        "print(keras_compat.patch(trainer))\n"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]" and "shipyard:" not in proc.stderr
