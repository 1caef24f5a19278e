"""Horovod's Keras callbacks for the standalone ``keras`` package."""

import keras

from shipyard.horovod.tensorflow._keras_impl import CALLBACKS, callbacks_for

globals().update(callbacks_for(keras))
__all__ = list(CALLBACKS)
