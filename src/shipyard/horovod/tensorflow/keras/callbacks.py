"""Horovod's Keras callbacks for ``tf.keras`` (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1)."""

import tensorflow as tf

from .._keras_impl import make_callbacks

_cb = make_callbacks(tf.keras)
BroadcastGlobalVariablesCallback = _cb.BroadcastGlobalVariablesCallback
MetricAverageCallback = _cb.MetricAverageCallback
LearningRateScheduleCallback = _cb.LearningRateScheduleCallback
LearningRateWarmupCallback = _cb.LearningRateWarmupCallback

__all__ = [
           "BroadcastGlobalVariablesCallback",
           "LearningRateScheduleCallback",
           "LearningRateWarmupCallback",
           "MetricAverageCallback",
]
