"""Horovod 0.16-0.20's Keras callbacks as the tf-distribution-options notebook uses them:
``LearningRateWarmupCallback(warmup_epochs=5, verbose=1)`` and
``LearningRateScheduleCallback(multiplier=..., start_epoch=...)`` with no ``initial_lr``
(those releases read it from the optimizer when training begins; 0.21 made it the first
argument), and ``MetricAverageCallback`` leaving numpy scalars numpy scalars. One rank,
Keras 3: the TF 1.x Keras path runs in the notebook's own test
(tests/integration/environments/test_tf_distribution_notebook.py). Real TensorFlow (its
import alone 7-10 s of CPU), so not in the unit tier (issue 36: ``make test-fast`` imports
no framework); tests/unit/horovod holds the engine's other single-rank tests."""

from __future__ import annotations

import numpy as np
import pytest
from tests.lazy import lazy, needs

pytestmark = needs("tensorflow")
tf = lazy("tensorflow")


def _fit(callbacks, lr=0.1, epochs=2):
    import shipyard.horovod.tensorflow.keras as hvd

    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(lr)), loss="mse")
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    model.fit(x, x.sum(1), batch_size=8, epochs=epochs, verbose=0, callbacks=callbacks)
    return float(np.asarray(model.optimizer.learning_rate))


def test_warmup_without_initial_lr_reads_the_optimizers_rate(single_rank):
    import shipyard.horovod.tensorflow.keras as hvd

    warmup = hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=5, verbose=1)
    assert _fit([warmup]) == pytest.approx(0.1)  # one rank: the warmup's ramp is flat
    assert warmup.initial_lr == pytest.approx(0.1)


def test_schedule_with_a_multiplier_only_scales_the_optimizers_rate(single_rank):
    import shipyard.horovod.tensorflow.keras as hvd

    schedule = hvd.callbacks.LearningRateScheduleCallback(multiplier=0.5, start_epoch=1)
    assert _fit([schedule]) == pytest.approx(0.05)


def test_the_0_20_positional_order_is_refused_naming_the_keywords(single_rank):
    import shipyard.horovod.tensorflow.keras as hvd

    with pytest.raises(TypeError, match=r"positional order; give the rest by keyword"):
        hvd.callbacks.LearningRateScheduleCallback(lambda epoch: 0.5, 1)
    with pytest.raises(TypeError, match="needs a multiplier"):
        hvd.callbacks.LearningRateScheduleCallback()


def test_averaged_metrics_keep_their_numpy_types(single_rank):
    """TF 1.x Keras logs numpy scalars and Horovod 0.16 gave them back as such; the
    notebook's save_history keeps only lists of np.float32/np.float64."""
    import shipyard.horovod.tensorflow.keras as hvd

    logs = {"loss": np.float32(1.5), "acc": np.float64(0.25), "lr": 0.001}
    hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    assert type(logs["loss"]) is np.float32 and logs["loss"] == np.float32(1.5)
    assert type(logs["acc"]) is np.float64 and type(logs["lr"]) is float
