"""Horovod's Keras callbacks for ``tf.keras`` (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1)."""

import tensorflow as tf

from .._keras_impl import CALLBACKS, callbacks_for

globals().update(callbacks_for(tf.keras))
__all__ = list(CALLBACKS)
