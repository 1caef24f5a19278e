"""``horovod.keras`` (standalone Keras): the API of ``shipyard.horovod.tensorflow.keras``,
with callbacks built on the standalone ``keras`` package's Callback."""

from shipyard.horovod.tensorflow.keras import *  # the same API, listed there

from . import callbacks  # noqa: F401 - standalone keras callbacks, not tf.keras ones
