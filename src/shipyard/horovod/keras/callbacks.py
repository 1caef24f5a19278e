"""Horovod's Keras callbacks for the standalone ``keras`` package."""

import keras

from shipyard.horovod.tensorflow._keras_impl import make_callbacks

_cb = make_callbacks(keras)
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
